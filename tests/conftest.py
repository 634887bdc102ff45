"""Fixtures for every test."""

import pytest
import torch


@pytest.fixture(autouse=True)
def seeded_torch():
    """Every test starts from the same global random state, whatever ran before it or beside it, so that inputs
    drawn with the global generator (upstream gradients, initial weights) do not depend on the order of the run."""
    torch.manual_seed(0)
    yield


@pytest.fixture
def triton_paths(monkeypatch):
    """`triton_paths(chunk=16)`: every kernel choice of the default attention made as on CUDA, for tensors on any
    device (on CPU the kernels run in Triton's interpreter): the band, the tails (in chunks of `chunk` positions,
    so that short inputs span several) and the two decoding steps. Returns the set that collects the names of the
    kernels' entry points as they are chosen."""

    def use(chunk: int = 16) -> set:
        from modeling_scaleformer import ops_decay, ops_decay_triton, ops_local_softmax, ops_local_softmax_triton

        used = set()

        def chosen(entry):
            if entry is not None:
                used.add(entry.__name__)
            return entry

        for name, entry in (("_band_function", "TritonLocalSoftmaxBand"), ("_decode_function", "decode_step"),
                            ("_cross_decode_function", "cross_decode")):
            monkeypatch.setattr(ops_local_softmax, name,
                                lambda device, entry=entry: chosen(getattr(ops_local_softmax_triton, entry)))
        choose = ops_decay._tail_kernel
        monkeypatch.setattr(ops_decay, "_tail_kernel", lambda device, dim: chosen(choose(torch.device("cuda"), dim)))
        monkeypatch.setattr(ops_decay_triton, "CHUNK", chunk)
        return used

    return use
