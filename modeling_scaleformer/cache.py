"""ScaleformerCache: the generation state of every decoder layer in one `Cache`."""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


def _map_tensors(obj, fn):
    """Apply fn to every tensor field of a state NamedTuple (None stays None)."""
    if obj is None:
        return None
    return type(obj)(*(fn(x) if isinstance(x, torch.Tensor) else x for x in obj))


class ScaleformerStateLayer(CacheLayerMixin):
    """One decoder layer's state: the self-attention state and the cross-attention summary.

    `self_state` is the state NamedTuple of the layer's attention variant (every tensor field has the
    batch first; `seen` counts the tokens seen). For the kernelized variants it is recurrent and does
    not grow with the number of generated tokens; the softmax baselines keep their keys and values.
    The cross-attention summary is computed once from the encoder output. The first layer's slot also holds
    `token_counts` with `config.remaining_count_max`: (batch, vocab_size) integers, how many more times each token
    id occurs in the source than it has been written.
    """

    is_compileable = False
    is_croppable = False
    supports_early_init = False

    def __init__(self):
        super().__init__()
        self.self_state: tuple | None = None
        self.cross_summary: tuple | None = None
        self.token_counts: torch.Tensor | None = None

    def lazy_initialization(self, key_states, value_states) -> None:
        raise NotImplementedError("ScaleformerStateLayer is filled by the model's attention, not from keys/values")

    def update(self, key_states, value_states, *args, **kwargs):
        raise NotImplementedError(
            "ScaleformerCache keeps a recurrent state, not keys and values: it cannot be updated with key/value states"
        )

    def get_seq_length(self) -> int:
        return 0 if self.self_state is None else self.self_state.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.self_state = None
        self.cross_summary = None
        self.token_counts = None

    def _apply(self, fn) -> None:
        self.self_state = _map_tensors(self.self_state, fn)
        self.cross_summary = _map_tensors(self.cross_summary, fn)
        self.token_counts = None if self.token_counts is None else fn(self.token_counts)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._apply(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._apply(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._apply(lambda t: t[indices])

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a recurrent state cannot be cropped: ScaleformerCache does not keep past tokens")

    def offload(self):
        self._apply(lambda t: t.to("cpu", non_blocking=True))

    def prefetch(self):
        pass

    @property
    def nbytes(self) -> int:
        total = 0
        for part in (self.self_state, self.cross_summary):
            if part is not None:
                total += sum(t.numel() * t.element_size() for t in part if isinstance(t, torch.Tensor))
        if self.token_counts is not None:
            total += self.token_counts.numel() * self.token_counts.element_size()
        return total


class ScaleformerCache(Cache):
    """Generation state of a Scaleformer decoder: one `ScaleformerStateLayer` per decoder layer.

    With the kernelized attention variants the self-attention state has a fixed size whatever the
    number of tokens generated. It counts the tokens seen, which is what `get_seq_length` returns.
    Beam search reorders it with `reorder_cache`.
    """

    def __init__(self, num_layers: int):
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"`num_layers` must be a positive int, got {num_layers!r}")
        super().__init__(layers=[ScaleformerStateLayer() for _ in range(num_layers)])

    @property
    def nbytes(self) -> int:
        """Bytes held by all layers' tensors."""
        return sum(layer.nbytes for layer in self.layers)

    @property
    def self_attention_nbytes(self) -> int:
        """Bytes held by the self-attention states (constant during generation for kernelized variants)."""
        return sum(
            sum(t.numel() * t.element_size() for t in layer.self_state if isinstance(t, torch.Tensor))
            for layer in self.layers
            if layer.self_state is not None
        )


__all__ = ["ScaleformerCache", "ScaleformerStateLayer"]
