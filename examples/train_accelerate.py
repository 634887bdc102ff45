"""Train a Scaleformer encoder-decoder on a seq2seq task with a plain loop on `accelerate.Accelerator`.

The default task is English -> Spanish Bible verses from the shipped sample (`examples/data/bible`);
any folder of `{train,validation}.jsonl` works with `--data_dir`, `--source_field` and `--target_field`,
for instance the code -> docstring pairs of `examples/data/build_docstrings.py` (fields `source` and
`docstring`). The same command runs on one process, on several CPU processes and on GPUs under DDP,
FSDP or DeepSpeed; the launch settings live in `configs/accelerate/`:

    python examples/train_accelerate.py --max_steps 200                       # one process
    ACCELERATE_USE_CPU=true accelerate launch --config_file configs/accelerate/cpu_2proc.yaml \\
        examples/train_accelerate.py --per_device_batch_size 8 --max_steps 200  # 2 ranks on CPU
    accelerate launch --config_file configs/accelerate/ddp_multi_gpu.yaml examples/train_accelerate.py ...

Data order. Each optimizer step consumes one *global batch* of
`per_device_batch_size * gradient_accumulation_steps * num_processes` examples. Every rank builds the
same list of global batches from `--seed` and the epoch number (a seeded permutation of the training
set, optionally grouped by length), so the sequence of global batches depends on the seed and the
global batch size only: one process with `--per_device_batch_size 8` and two processes with
`--per_device_batch_size 4` see the same examples at every step. Within a global batch the examples
are sorted by length (less padding) and dealt out in contiguous slices: micro-step `a` of rank `r`
gets slice `a * num_processes + r`. Accelerate's dataloader sharding is not used. Examples that do
not fill a last global batch are left out of that epoch (the count is logged; the next epoch's
permutation differs).

Loss normalisation. The model returns `sum of token cross-entropies / num_items_in_batch`. Every rank
knows the whole global batch, so `num_items_in_batch` is the number of target tokens of the global
batch (the value a gather of the per-rank, per-micro-batch counts would give), computed locally
without communication. The loss handed to `accelerator.backward` is multiplied by
`num_processes * gradient_accumulation_steps`, which cancels the division by the accumulation steps
in `accelerator.backward` and the averaging of gradients across ranks in DDP/FSDP/DeepSpeed: the
gradient of each optimizer step equals that of the mean token loss of the global batch on one
process. The logged training loss is that mean (summed over ranks and micro-batches).

Checkpoints (`--checkpointing_steps`) are `accelerator.save_state` folders
`<output_dir>/checkpoints/step_<N>` holding model, optimizer, scheduler, random states and the step
counter; `--resume_from_checkpoint` (a folder or `latest`) continues at the next step with the same
data order. At the end the unwrapped model and the tokenizer are saved to `--output_dir`, which then
loads with `AutoModelForSeq2SeqLM.from_pretrained`.

Written to `--output_dir` by the main process: `run_info.json` (distributed type, processes and their
ids, batch sizes, dataset counts) and `log_history.jsonl` (one JSON record per logging or evaluation
step).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import re
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import datasets
import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import DistributedType, gather_object, parse_flag_from_env, set_seed
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedTokenizerBase, SchedulerType, get_scheduler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: examples.*, model_cards.*

from examples.common import (  # noqa: E402
    BIBLE_DIR,
    ROOT,
    TOKENIZER_DIR,
    Seq2SeqExamples,
    filter_by_length,
    load_jsonl_splits,
    text_scorer,
    token_config,
    tokenize_split,
)
from modeling_scaleformer import ScaleformerConfig, ScaleformerForConditionalGeneration  # noqa: E402

logger = get_logger(__name__)

CHECKPOINT_PREFIX = "step_"
#: How many global batches one length-sorted "mega-batch" holds with --group_by_length (as in
#: transformers' LengthGroupedSampler).
MEGABATCH_MULTIPLIER = 50


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and check the command line; raise `ValueError` naming the argument on bad values."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = parser.add_argument_group("data")
    data.add_argument("--data_dir", default=str(BIBLE_DIR),
                      help="folder with train.jsonl and validation.jsonl (default: the shipped Bible sample)")
    data.add_argument("--source_field", default="en", help="JSON field of the model input (default: en)")
    data.add_argument("--target_field", default="es", help="JSON field of the target (default: es)")
    data.add_argument("--max_source_length", type=int, default=None,
                      help="drop (never truncate) examples whose source has more tokens; the number dropped is "
                           "logged and written to run_info.json (default: no limit)")
    data.add_argument("--max_target_length", type=int, default=None,
                      help="drop (never truncate) examples whose target has more tokens (default: no limit)")
    data.add_argument("--max_train_examples", type=int, default=None,
                      help="use only the first N training examples (default: all)")
    data.add_argument("--group_by_length", action="store_true",
                      help=f"form global batches of similar length inside seeded mega-batches of "
                           f"{MEGABATCH_MULTIPLIER} global batches (less padding)")

    model = parser.add_argument_group("model")
    source = model.add_mutually_exclusive_group()
    source.add_argument("--model_config", default=None,
                        help="JSON config of a new, randomly initialised model "
                             "(default: configs/scaleformer-tiny.json)")
    source.add_argument("--model_name_or_path", default=None, help="saved model folder to fine-tune")
    model.add_argument("--tokenizer", default=None,
                       help="tokenizer folder (default: --model_name_or_path if given, else examples/tokenizer)")

    train = parser.add_argument_group("training")
    train.add_argument("--output_dir", default=str(ROOT / "outputs" / "train-accelerate"),
                       help="model, tokenizer, logs and checkpoints (default: outputs/train-accelerate)")
    train.add_argument("--per_device_batch_size", type=int, default=16,
                       help="examples per process and micro-step (default: %(default)s)")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1,
                       help="micro-steps per optimizer step (default: %(default)s)")
    train.add_argument("--learning_rate", type=float, default=1e-3,
                       help="peak AdamW learning rate (default: %(default)s)")
    train.add_argument("--weight_decay", type=float, default=0.01,
                       help="AdamW weight decay of matrices and embeddings, not of biases and norms "
                            "(default: %(default)s)")
    train.add_argument("--lr_scheduler_type", default="linear", choices=[t.value for t in SchedulerType],
                       metavar="TYPE", help="a transformers.SchedulerType: linear, cosine, constant_with_warmup, ... "
                                            "(default: %(default)s)")
    train.add_argument("--warmup_steps", type=int, default=60,
                       help="steps of linear learning-rate warm-up (default: %(default)s)")
    train.add_argument("--max_grad_norm", type=float, default=1.0,
                       help="gradient clipping norm, 0: off (default: %(default)s)")
    train.add_argument("--num_epochs", type=int, default=3, help="passes over the training set (default: %(default)s)")
    train.add_argument("--max_steps", type=int, default=None, help="optimizer steps; overrides --num_epochs")
    train.add_argument("--mixed_precision", choices=["no", "bf16", "fp16"], default=None,
                       help="passed to Accelerator (default: the accelerate config or launcher, else no)")
    train.add_argument("--seed", type=int, default=0, help="model initialisation and data order (default: %(default)s)")

    ckpt = parser.add_argument_group("checkpoints and logging")
    ckpt.add_argument("--checkpointing_steps", type=int, default=None,
                      help="save_state every N optimizer steps to <output_dir>/checkpoints/step_<N>")
    ckpt.add_argument("--resume_from_checkpoint", default=None,
                      help="a checkpoint folder, or 'latest' for the highest step under <output_dir>/checkpoints")
    ckpt.add_argument("--logging_steps", type=int, default=10,
                      help="log the mean training loss of every N optimizer steps (default: %(default)s)")
    ckpt.add_argument("--with_tracking", action="store_true", help="also log to experiment trackers")
    ckpt.add_argument("--report_to", default="all",
                      help="trackers for --with_tracking: all, tensorboard, wandb, ... (default: all installed)")
    ckpt.add_argument("--dump_gradients", default=None, metavar="PATH",
                      help="debugging: torch.save the reduced gradient of every parameter after the backward "
                           "pass of this run's first optimizer step (before clipping and the update) to PATH, "
                           "from rank 0; with the step's example indices per rank and micro-batch")

    evaluation = parser.add_argument_group("evaluation")
    evaluation.add_argument("--eval_steps", type=int, default=500,
                            help="evaluate every N optimizer steps and after the last one, 0: never "
                                 "(default: %(default)s)")
    evaluation.add_argument("--eval_examples", type=int, default=200,
                            help="first N validation examples for held-out loss and greedy decoding, 0: all "
                                 "(default: %(default)s)")
    evaluation.add_argument("--per_device_eval_batch_size", type=int, default=32,
                            help="evaluation examples per process and batch (default: %(default)s)")
    evaluation.add_argument("--eval_max_new_tokens", type=int, default=128,
                            help="new tokens of greedy decoding for chrF/BLEU, 0: held-out loss only "
                                 "(default: %(default)s)")
    args = parser.parse_args(argv)
    if args.model_config is None and args.model_name_or_path is None:
        args.model_config = str(ROOT / "configs" / "scaleformer-tiny.json")
    if args.tokenizer is None:
        args.tokenizer = args.model_name_or_path or str(TOKENIZER_DIR)
    check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    """Raise `ValueError` naming the argument for values no run can use."""
    positive = ["per_device_batch_size", "gradient_accumulation_steps", "num_epochs", "logging_steps",
                "per_device_eval_batch_size"]
    optional_positive = ["max_steps", "max_source_length", "max_target_length", "checkpointing_steps",
                         "max_train_examples"]
    for name in positive:
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    for name in optional_positive:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be >= 1 when given, got {value}")
    for name in ("warmup_steps", "eval_steps", "eval_examples", "eval_max_new_tokens"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name} must be >= 0, got {getattr(args, name)}")
    for name in ("learning_rate", "weight_decay", "max_grad_norm"):
        value = getattr(args, name)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"--{name} must be a finite number >= 0, got {value}")
    if args.learning_rate == 0:
        raise ValueError("--learning_rate must be > 0, got 0")
    if args.source_field == args.target_field:
        raise ValueError(f"--source_field and --target_field must differ, both are {args.source_field!r}")
    for name in ("data_dir", "tokenizer", "model_name_or_path"):
        value = getattr(args, name)
        if value is not None and not Path(value).is_dir():
            raise ValueError(f"--{name} must be an existing folder, got {value!r}")
    if args.model_config is not None and not Path(args.model_config).is_file():
        raise ValueError(f"--model_config must be an existing JSON file, got {args.model_config!r}")


class GlobalBatchPlan:
    """The seeded sequence of global batches, identical on every rank and for any number of processes.

    Args:
        lengths (`list[int]`): a length per training example (source + target tokens).
        global_batch_size (`int`): examples per optimizer step, all processes and micro-steps together.
        seed (`int`): seed of the per-epoch permutations.
        group_by_length (`bool`): sort seeded mega-batches of `MEGABATCH_MULTIPLIER` global batches by
            length before cutting them, then shuffle the global batches.
    """

    def __init__(self, lengths: list[int], global_batch_size: int, seed: int, group_by_length: bool):
        self.lengths = lengths
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.group_by_length = group_by_length
        self.steps_per_epoch = len(lengths) // global_batch_size
        self.dropped_per_epoch = len(lengths) - self.steps_per_epoch * global_batch_size
        self._cache: tuple[int, list[list[int]]] | None = None

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """The global batches of `epoch` (0-based), each sorted by decreasing length."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        rng = random.Random(self.seed * 1_000_003 + epoch)
        order = list(range(len(self.lengths)))
        rng.shuffle(order)
        if self.group_by_length:
            mega = self.global_batch_size * MEGABATCH_MULTIPLIER
            order = [i for start in range(0, len(order), mega)
                     for i in sorted(order[start : start + mega], key=lambda j: -self.lengths[j])]
        size = self.global_batch_size
        batches = [order[b * size : (b + 1) * size] for b in range(self.steps_per_epoch)]
        if self.group_by_length:
            rng.shuffle(batches)
        # a stable sort: ties keep the seeded order
        batches = [sorted(batch, key=lambda j: -self.lengths[j]) for batch in batches]
        self._cache = (epoch, batches)
        return batches

    def global_batch(self, step: int) -> list[int]:
        """The examples of optimizer step `step` (0-based, counted over epochs)."""
        return self.epoch_batches(step // self.steps_per_epoch)[step % self.steps_per_epoch]


def local_micro_batch(
    global_batch: list[int], micro_step: int, process_index: int, num_processes: int, per_device_batch_size: int
) -> list[int]:
    """Slice `micro_step * num_processes + process_index` of a global batch."""
    start = (micro_step * num_processes + process_index) * per_device_batch_size
    return global_batch[start : start + per_device_batch_size]


class TrainingProgress:
    """Step counter and data-order settings, saved in checkpoints with `register_for_checkpointing`."""

    def __init__(self, seed: int, global_batch_size: int, num_train_examples: int, group_by_length: bool):
        self.completed_steps = 0
        self.settings = {
            "seed": seed,
            "global_batch_size": global_batch_size,
            "num_train_examples": num_train_examples,
            "group_by_length": group_by_length,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"completed_steps": self.completed_steps, **self.settings}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the step counter; raise `ValueError` if the data order would differ from the saved run."""
        hints = {
            "seed": "--seed",
            "global_batch_size": "--per_device_batch_size x --gradient_accumulation_steps x processes",
            "num_train_examples": "--data_dir / --max_train_examples / --max_*_length",
            "group_by_length": "--group_by_length",
        }
        for key, value in self.settings.items():
            if state[key] != value:
                raise ValueError(
                    f"the checkpoint was written with {key}={state[key]!r}, this run has {value!r} "
                    f"({hints[key]}); the data order would differ"
                )
        self.completed_steps = int(state["completed_steps"])


def find_checkpoint(resume_from_checkpoint: str, output_dir: Path) -> Path:
    """Resolve `--resume_from_checkpoint`: a folder, or `latest` = highest `step_<N>` under output_dir."""
    if resume_from_checkpoint != "latest":
        path = Path(resume_from_checkpoint)
        if not path.is_dir():
            raise ValueError(f"--resume_from_checkpoint {resume_from_checkpoint!r} is not a folder")
        return path
    pattern = re.compile(rf"{CHECKPOINT_PREFIX}(\d+)")
    found = [
        (int(match.group(1)), path)
        for path in (output_dir / "checkpoints").glob(f"{CHECKPOINT_PREFIX}*")
        if path.is_dir() and (match := pattern.fullmatch(path.name))
    ]
    if not found:
        raise ValueError(
            f"--resume_from_checkpoint latest: no {CHECKPOINT_PREFIX}<N> folder in {output_dir / 'checkpoints'}"
        )
    return max(found)[1]


def load_examples(
    args: argparse.Namespace, tokenizer: PreTrainedTokenizerBase, accelerator: Accelerator
) -> tuple[Seq2SeqExamples, Seq2SeqExamples | None, int]:
    """Training examples, validation examples (`None` without evaluation), training examples dropped."""
    with accelerator.main_process_first():
        splits = load_jsonl_splits(args.data_dir)
    if "train" not in splits:
        raise ValueError(f"--data_dir {args.data_dir!r} has no train.jsonl")
    train_split = splits["train"]
    if args.max_train_examples is not None:
        train_split = train_split.select(range(min(args.max_train_examples, len(train_split))))
    train, train_dropped = filter_by_length(
        tokenize_split(train_split, "train", tokenizer, args.source_field, args.target_field),
        args.max_source_length, args.max_target_length,
    )
    logger.info(f"train: {len(train)} examples kept, {train_dropped} longer than the length limits dropped")
    if args.eval_steps == 0:
        return train, None, train_dropped
    if "validation" not in splits:
        raise ValueError(f"--eval_steps {args.eval_steps} needs validation.jsonl in --data_dir {args.data_dir!r}")
    val_split = splits["validation"]
    if args.eval_examples:
        val_split = val_split.select(range(min(args.eval_examples, len(val_split))))
    validation, val_dropped = filter_by_length(
        tokenize_split(val_split, "validation", tokenizer, args.source_field, args.target_field),
        args.max_source_length, args.max_target_length,
    )
    logger.info(f"validation: {len(validation)} examples kept, {val_dropped} longer than the limits dropped")
    if len(validation) == 0:
        raise ValueError("no validation example is within --max_source_length/--max_target_length")
    return train, validation, train_dropped


def build_model(args: argparse.Namespace, tokenizer: PreTrainedTokenizerBase) -> ScaleformerForConditionalGeneration:
    """A new model from `--model_config` sized to the tokenizer, or the saved `--model_name_or_path`."""
    if args.model_name_or_path is not None:
        model = ScaleformerForConditionalGeneration.from_pretrained(args.model_name_or_path)
        if len(tokenizer) > model.config.vocab_size:
            raise ValueError(
                f"--tokenizer has {len(tokenizer)} tokens, more than the vocab_size {model.config.vocab_size} "
                f"of --model_name_or_path"
            )
        return model
    config = ScaleformerConfig.from_pretrained(args.model_config, **token_config(tokenizer))
    return ScaleformerForConditionalGeneration(config)


def make_optimizer(model: torch.nn.Module, learning_rate: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on tensors of two or more dimensions only."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=learning_rate,
    )


def check_distributed_setup(accelerator: Accelerator, args: argparse.Namespace) -> None:
    """Refuse set-ups that would silently train something else than asked."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and accelerator.num_processes == 1:
        raise ValueError(
            f"launched with WORLD_SIZE={world_size} but accelerate found no distributed back-end, so each "
            f"process would train alone on all the data; on CPU set ACCELERATE_USE_CPU=true "
            f"(see configs/accelerate/cpu_2proc.yaml)"
        )
    for flag, wanted in (("ACCELERATE_USE_FSDP", DistributedType.FSDP),
                         ("ACCELERATE_USE_DEEPSPEED", DistributedType.DEEPSPEED)):
        if parse_flag_from_env(flag) and accelerator.distributed_type != wanted:
            raise ValueError(
                f"the launcher asked for {wanted.value} ({flag}=true) but accelerate set up "
                f"{accelerator.distributed_type.value} (on CPU it does not apply {wanted.value}); use "
                f"configs/accelerate/cpu_2proc.yaml on CPU"
            )
    sharded = accelerator.distributed_type == DistributedType.FSDP or (
        accelerator.distributed_type == DistributedType.DEEPSPEED
        and accelerator.state.deepspeed_plugin.zero_stage == 3
    )
    if sharded and args.eval_steps > 0:
        raise ValueError(
            "--eval_steps needs the full parameters on every rank, which FSDP and ZeRO-3 shard; pass "
            "--eval_steps 0 and evaluate the saved model"
        )
    if args.dump_gradients is not None and accelerator.distributed_type not in (
        DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU
    ):
        raise ValueError(
            f"--dump_gradients reads parameter .grad, which {accelerator.distributed_type.value} does not hold "
            f"in full; use it without FSDP or DeepSpeed"
        )
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
        for key, arg in (("train_micro_batch_size_per_gpu", "per_device_batch_size"),
                         ("gradient_clipping", "max_grad_norm"),
                         ("gradient_accumulation_steps", "gradient_accumulation_steps")):
            value = getattr(args, arg)
            if ds_config.get(key, "auto") == "auto":
                ds_config[key] = value
            elif ds_config[key] != value:
                raise ValueError(
                    f"the DeepSpeed config sets {key}={ds_config[key]} but --{arg} is {value}; leave {key} out "
                    f"of the config or pass the same value"
                )


@torch.no_grad()
def evaluate(
    accelerator: Accelerator,
    model: ScaleformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    examples: Seq2SeqExamples,
    batch_size: int,
    max_new_tokens: int,
    score: Callable[[list[str], list[str]], dict[str, float]] | None,
) -> dict[str, float]:
    """Held-out token-mean loss and, if `max_new_tokens > 0`, chrF and BLEU of greedy decoding by `score`.

    Each rank takes a contiguous share of the examples and runs the unwrapped model (no collective
    calls inside, so shares may differ in size); sums and hypotheses are then gathered.
    """
    was_training = model.training
    model.eval()
    indices = list(range(len(examples)))
    with accelerator.split_between_processes(indices) as share:
        local_indices = list(share)
    loss_sum = torch.zeros((), dtype=torch.float64, device=accelerator.device)
    token_count = torch.zeros((), dtype=torch.float64, device=accelerator.device)
    hypotheses: list[str] = []
    for start in range(0, len(local_indices), batch_size):
        chunk = local_indices[start : start + batch_size]
        batch = {k: v.to(accelerator.device) for k, v in examples.batch(chunk, tokenizer.pad_token_id).items()}
        with accelerator.autocast():
            # num_items_in_batch=1 makes the returned loss the sum of token cross-entropies
            loss_sum += model(**batch, num_items_in_batch=1).loss.double()
            token_count += (batch["labels"] != -100).sum()
            if max_new_tokens > 0:
                generated = model.generate(
                    input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                )
                hypotheses += [h.strip() for h in tokenizer.batch_decode(generated, skip_special_tokens=True)]
    loss_sum = accelerator.reduce(loss_sum, "sum")
    token_count = accelerator.reduce(token_count, "sum")
    metrics = {"eval_loss": (loss_sum / token_count).item()}
    if max_new_tokens > 0:
        scores = score(gather_object(hypotheses), [examples.references[i] for i in indices])
        metrics |= {f"eval_{name}": scores[name] for name in ("chrf", "bleu")}
    model.train(was_training)
    return metrics


def write_run_info(
    accelerator: Accelerator, args: argparse.Namespace, plan: GlobalBatchPlan, max_steps: int, counts: dict[str, int]
) -> None:
    """`<output_dir>/run_info.json` from the main process: the distributed set-up, its ranks, the batch sizes and
    `counts`. Every rank calls it (the ranks are gathered)."""
    ranks = gather_object([{"process_index": accelerator.process_index, "pid": os.getpid(),
                            "host": socket.gethostname(), "device": str(accelerator.device)}])
    if accelerator.is_main_process:
        run_info = {
            "distributed_type": str(accelerator.distributed_type).split(".")[-1],
            "num_processes": accelerator.num_processes,
            "ranks": ranks,
            "mixed_precision": accelerator.mixed_precision,
            "per_device_batch_size": args.per_device_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "global_batch_size": plan.global_batch_size,
            "steps_per_epoch": plan.steps_per_epoch,
            "max_steps": max_steps,
            **counts,
        }
        (Path(args.output_dir) / "run_info.json").write_text(json.dumps(run_info, indent=2))


class LogWriter:
    """Appends JSON records to `<output_dir>/log_history.jsonl` on the main process and to trackers."""

    def __init__(self, accelerator: Accelerator, output_dir: Path, with_tracking: bool):
        self.accelerator = accelerator
        self.path = output_dir / "log_history.jsonl"
        self.with_tracking = with_tracking

    def write(self, record: dict[str, Any]) -> None:
        if self.accelerator.is_main_process:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        if self.with_tracking:
            self.accelerator.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])
        logger.info(" ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()))


def main(argv: Sequence[str] | None = None) -> None:
    """Run training as described in the module docstring."""
    args = parse_args(argv)
    output_dir = Path(args.output_dir)
    accelerator = Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        mixed_precision=args.mixed_precision,
        # the loop steps the scheduler once per optimizer step itself
        step_scheduler_with_optimizer=False,
        log_with=args.report_to if args.with_tracking else None,
        project_dir=str(output_dir),
    )
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if not accelerator.is_local_main_process:
        datasets.utils.logging.set_verbosity_error()
    check_distributed_setup(accelerator, args)
    set_seed(args.seed)
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    train, validation, train_dropped = load_examples(args, tokenizer, accelerator)
    score = text_scorer("sacrebleu") if validation is not None and args.eval_max_new_tokens > 0 else None

    num_processes = accelerator.num_processes
    global_batch_size = args.per_device_batch_size * args.gradient_accumulation_steps * num_processes
    plan = GlobalBatchPlan(train.lengths(), global_batch_size, args.seed, args.group_by_length)
    if plan.steps_per_epoch == 0:
        raise ValueError(
            f"the global batch ({global_batch_size} = --per_device_batch_size {args.per_device_batch_size} x "
            f"--gradient_accumulation_steps {args.gradient_accumulation_steps} x {num_processes} processes) is "
            f"larger than the {len(train)} training examples"
        )
    max_steps = args.max_steps if args.max_steps is not None else args.num_epochs * plan.steps_per_epoch
    logger.info(
        f"{accelerator.distributed_type}, {num_processes} processes; global batch {global_batch_size}, "
        f"{plan.steps_per_epoch} steps per epoch ({plan.dropped_per_epoch} examples per epoch left out), "
        f"{max_steps} steps"
    )

    model = build_model(args, tokenizer)
    optimizer = make_optimizer(model, args.learning_rate, args.weight_decay)
    lr_scheduler = get_scheduler(
        args.lr_scheduler_type, optimizer, num_warmup_steps=args.warmup_steps, num_training_steps=max_steps
    )
    model, optimizer, lr_scheduler = accelerator.prepare(model, optimizer, lr_scheduler)
    if accelerator.gradient_accumulation_steps != args.gradient_accumulation_steps:
        raise ValueError(
            f"accelerate uses {accelerator.gradient_accumulation_steps} gradient accumulation steps, "
            f"--gradient_accumulation_steps is {args.gradient_accumulation_steps}"
        )
    progress = TrainingProgress(args.seed, global_batch_size, len(train), args.group_by_length)
    accelerator.register_for_checkpointing(progress)

    write_run_info(accelerator, args, plan, max_steps, {
        "train_examples": len(train),
        "train_dropped_by_length": train_dropped,
        "parameters": sum(p.numel() for p in accelerator.unwrap_model(model).parameters()),
    })

    if args.resume_from_checkpoint is not None:
        checkpoint = find_checkpoint(args.resume_from_checkpoint, output_dir)
        accelerator.load_state(str(checkpoint))
        logger.info(f"resumed from {checkpoint} after step {progress.completed_steps}")
        if progress.completed_steps > max_steps:
            raise ValueError(
                f"--resume_from_checkpoint {checkpoint} is after step {progress.completed_steps}, beyond the "
                f"{max_steps} steps of this run (--max_steps / --num_epochs)"
            )
    if args.with_tracking:
        accelerator.init_trackers(
            "scaleformer_train_accelerate",
            config={k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool))},
        )
    log = LogWriter(accelerator, output_dir, args.with_tracking)

    model.train()
    scale = num_processes * args.gradient_accumulation_steps
    window_loss = torch.zeros((), dtype=torch.float64, device=accelerator.device)
    window_steps, window_start = 0, time.time()
    gradients_dumped = False
    bar = tqdm(total=max_steps, initial=progress.completed_steps, disable=not accelerator.is_local_main_process)
    while progress.completed_steps < max_steps:
        step = progress.completed_steps
        step_lr = lr_scheduler.get_last_lr()[0]
        global_batch = plan.global_batch(step)
        num_items_in_batch = sum(len(train.target_ids[i]) for i in global_batch)
        step_loss = torch.zeros((), dtype=torch.float64, device=accelerator.device)
        for micro_step in range(args.gradient_accumulation_steps):
            indices = local_micro_batch(global_batch, micro_step, accelerator.process_index, num_processes,
                                        args.per_device_batch_size)
            batch = {k: v.to(accelerator.device) for k, v in train.batch(indices, tokenizer.pad_token_id).items()}
            with accelerator.accumulate(model):
                loss = model(**batch, num_items_in_batch=num_items_in_batch).loss
                step_loss += loss.detach().double()
                accelerator.backward(loss * scale)
                if accelerator.sync_gradients:
                    if args.dump_gradients is not None and not gradients_dumped:
                        gradients_dumped = True
                        dump_gradients(accelerator, model, args.dump_gradients, global_batch,
                                       args.per_device_batch_size, num_items_in_batch)
                    if args.max_grad_norm > 0:
                        accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                if accelerator.sync_gradients and not accelerator.optimizer_step_was_skipped:
                    lr_scheduler.step()
                optimizer.zero_grad()
        if not accelerator.sync_gradients:
            raise RuntimeError("accelerate did not synchronise gradients at the end of a global batch")
        progress.completed_steps += 1
        bar.update(1)
        window_loss += step_loss
        window_steps += 1
        done = progress.completed_steps
        if done % args.logging_steps == 0 or done == max_steps:
            mean_loss = accelerator.reduce(window_loss, "sum").item() / window_steps
            log.write({"step": done, "epoch": done / plan.steps_per_epoch, "loss": mean_loss,
                       "learning_rate": step_lr,
                       "seconds_per_step": (time.time() - window_start) / window_steps})
            bar.set_postfix(loss=f"{mean_loss:.4f}")
            window_loss.zero_()
            window_steps, window_start = 0, time.time()
        if args.checkpointing_steps is not None and done % args.checkpointing_steps == 0:
            accelerator.save_state(str(output_dir / "checkpoints" / f"{CHECKPOINT_PREFIX}{done}"))
        if validation is not None and (done % args.eval_steps == 0 or done == max_steps):
            metrics = evaluate(accelerator, accelerator.unwrap_model(model), tokenizer, validation,
                               args.per_device_eval_batch_size, args.eval_max_new_tokens, score)
            log.write({"step": done, **metrics})
    bar.close()

    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    unwrapped.save_pretrained(
        output_dir, is_main_process=accelerator.is_main_process, save_function=accelerator.save,
        state_dict=accelerator.get_state_dict(model),
    )
    if accelerator.is_main_process:
        tokenizer.save_pretrained(output_dir)
    logger.info(f"saved the model and tokenizer to {output_dir}")
    accelerator.end_training()


def dump_gradients(
    accelerator: Accelerator,
    model: torch.nn.Module,
    path: str,
    global_batch: list[int],
    per_device_batch_size: int,
    num_items_in_batch: int,
) -> None:
    """Save `{name: gradient}` of the unwrapped model (already reduced across ranks) and the step's data.

    The file also holds the global batch, `num_items_in_batch` and, per rank, the example indices of
    each of its micro-batches.
    """
    micro_batches = [
        local_micro_batch(global_batch, a, accelerator.process_index, accelerator.num_processes, per_device_batch_size)
        for a in range(accelerator.gradient_accumulation_steps)
    ]
    per_rank = gather_object([{"process_index": accelerator.process_index, "micro_batches": micro_batches}])
    if accelerator.is_main_process:
        gradients = {
            name: p.grad.detach().cpu().clone()
            for name, p in accelerator.unwrap_model(model).named_parameters()
            if p.grad is not None
        }
        torch.save({"gradients": gradients, "global_batch": global_batch, "num_items_in_batch": num_items_in_batch,
                    "per_rank": per_rank}, path)


if __name__ == "__main__":
    main()
