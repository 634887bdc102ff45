"""Train a byte-level BPE tokenizer on text fields of JSON-lines files.

The tokenizer splits text into bytes first (GPT-2 style), so every string, in any language or
programming language, is encoded without unknown tokens and decoded back unchanged (unless it
contains a special-token string such as ``</s>`` itself). Special tokens are ``<pad>`` = 0,
``<s>`` = 1, ``</s>`` = 2 and ``<unk>`` = 3, and ``</s>`` is appended to every encoded sequence.
The result is saved as a ``transformers.PreTrainedTokenizerFast``, which
``AutoTokenizer.from_pretrained`` loads offline.

Example::

    python examples/data/train_tokenizer.py \\
        --files examples/data/bible/train.jsonl outputs/docstrings/train.jsonl \\
        --fields en es source docstring --vocab_size 8000 --output_dir examples/tokenizer
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: examples.*, model_cards.*

from examples.common import read_jsonl  # noqa: E402

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)


def train_bpe_tokenizer(
    texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer.

    Args:
        texts (`Iterable[str]`):
            The training text, one string per document.
        vocab_size (`int`, *optional*, defaults to 8000):
            Size of the vocabulary, the 4 special tokens and the 256 byte symbols included.
        min_frequency (`int`, *optional*, defaults to 2):
            A pair is merged only if it occurs at least this often.

    Returns:
        `PreTrainedTokenizerFast`: with ``<pad>`` = 0, ``<s>`` = 1, ``</s>`` = 2, ``<unk>`` = 3, a
        post-processor that appends ``</s>`` to every sequence (``$A </s>``; pairs: ``$A </s> $B </s>``),
        and ``clean_up_tokenization_spaces=False`` so that decoding returns the input unchanged.
    """
    min_vocab = len(SPECIAL_TOKENS) + len(pre_tokenizers.ByteLevel.alphabet())
    if vocab_size < min_vocab:
        raise ValueError(f"vocab_size must be at least {min_vocab} (special tokens + 256 bytes), got {vocab_size}")
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be at least 1, got {min_frequency}")

    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    # No prefix space: the first word of a text is then encoded as it is, and decoding is lossless.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    eos_id = tokenizer.token_to_id(EOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, eos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
    )


def iter_jsonl_texts(files: Sequence[str | Path], fields: Sequence[str]) -> Iterator[str]:
    """Yield the given string fields of every record of JSON-lines files; records lacking a field skip it.

    Raises:
        ValueError: when a file holds a field none of ``fields`` (a likely typo in ``--fields``).
    """
    for path in files:
        seen: set[str] = set()
        for record in read_jsonl(path):
            for name in fields:
                value = record.get(name)
                if isinstance(value, str) and value:
                    seen.add(name)
                    yield value
        if not seen:
            raise ValueError(f"--fields {list(fields)}: none of them holds text in {path}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", nargs="+", required=True, type=Path, help="JSON-lines training files")
    parser.add_argument("--fields", nargs="+", required=True, help="string fields to read from each record")
    parser.add_argument("--vocab_size", type=int, default=8000, help="vocabulary size (default 8000)")
    parser.add_argument("--min_frequency", type=int, default=2, help="minimum pair count to merge (default 2)")
    parser.add_argument("--output_dir", required=True, type=Path, help="where to save the tokenizer")
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.files if not path.is_file()]
    if missing:
        parser.error(f"--files: not found: {', '.join(missing)}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Train the tokenizer and save it with ``save_pretrained``."""
    args = parse_args(argv)
    try:
        tokenizer = train_bpe_tokenizer(
            iter_jsonl_texts(args.files, args.fields), vocab_size=args.vocab_size, min_frequency=args.min_frequency
        )
    except ValueError as error:
        raise SystemExit(str(error)) from error
    tokenizer.save_pretrained(args.output_dir)
    size = sum(path.stat().st_size for path in args.output_dir.iterdir() if path.is_file())
    print(f"vocabulary {len(tokenizer)} tokens; saved to {args.output_dir} ({size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
