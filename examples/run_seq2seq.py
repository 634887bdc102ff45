#!/usr/bin/env python
"""Train or fine-tune a sequence-to-sequence model (translation, summarisation) on a local JSON-lines folder.

Follows transformers' ``examples/pytorch/summarization/run_summarization.py``: ``ModelArguments``,
``DataTrainingArguments`` and ``Seq2SeqTrainingArguments`` through ``HfArgumentParser`` (also from one JSON
file), ``DataCollatorForSeq2Seq`` and ``Seq2SeqTrainer`` with ``predict_with_generate``. Everything runs offline:
the data is a folder with ``{train,validation,test}.jsonl``, the metrics are the local modules of
``examples/metrics/``. Examples longer than ``--max_source_length`` / ``--max_target_length`` tokens are dropped,
with a logged count, never truncated. At the end the output folder gets a model card (``model_cards/``), which
``--push_to_hub`` uploads with the model.

From scratch, on the shipped Bible sample (English -> Spanish, BLEU and chrF):

    HF_HUB_OFFLINE=1 python examples/run_seq2seq.py \\
        --config_name configs/scaleformer-tiny.json --tokenizer_name examples/tokenizer \\
        --output_dir outputs/run-seq2seq --do_train --do_eval --predict_with_generate \\
        --max_steps 300 --per_device_train_batch_size 32 --learning_rate 1e-3 --max_eval_samples 100

Fine-tuning a saved folder, on code -> docstring pairs (ROUGE):

    python examples/data/build_docstrings.py --output_dir outputs/docstrings --kinds function
    HF_HUB_OFFLINE=1 python examples/run_seq2seq.py \\
        --model_name_or_path outputs/run-seq2seq --trust_remote_code \\
        --data_dir outputs/docstrings --source_field source --target_field docstring --metric rouge \\
        --output_dir outputs/docstrings-run --do_train --do_eval --predict_with_generate --max_steps 300

Resume with ``--resume_from_checkpoint <output_dir>/checkpoint-N`` (same arguments otherwise).
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import datasets
import numpy as np
import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    EvalPrediction,
    HfArgumentParser,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: examples.*, model_cards.*

import modeling_scaleformer  # noqa: E402,F401  registers the Scaleformer classes with the Auto* classes
from examples.common import (  # noqa: E402
    BIBLE_DIR,
    METRICS_DIR,
    LengthFilter,
    check_fields,
    load_jsonl_splits,
    text_scorer,
    token_config,
)
from model_cards.write_model_card import TrainingRun, results_for_card, write_model_card  # noqa: E402


logger = logging.getLogger(__name__)

SCRIPT = "examples/run_seq2seq.py"
PIPELINE_TAGS = {"sacrebleu": "translation", "rouge": "summarization"}
SPLIT_FLAGS = {"train": "--do_train", "validation": "--do_eval", "test": "--do_predict"}


@dataclass
class ModelArguments:
    """Which model, configuration and tokenizer to train or fine-tune."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A saved model folder to fine-tune. Leave out to train from scratch with --config_name."},
    )
    config_name: str | None = field(
        default=None,
        metadata={"help": "Configuration (a configs/*.json file or a folder) for training from scratch."},
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={"help": "Tokenizer folder, e.g. examples/tokenizer; defaults to --model_name_or_path."},
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "Run the modeling code stored in a model folder (needed for custom models)."},
    )


@dataclass
class DataTrainingArguments:
    """What data to train and evaluate on, and how to score it."""

    data_dir: str = field(
        default=str(BIBLE_DIR),
        metadata={"help": "Folder with train.jsonl, validation.jsonl and/or test.jsonl."},
    )
    source_field: str = field(default="en", metadata={"help": "JSON field of the input text."})
    target_field: str = field(default="es", metadata={"help": "JSON field of the target text."})
    metric: Literal["sacrebleu", "rouge"] = field(
        default="sacrebleu",
        metadata={"help": "sacrebleu: BLEU and chrF (translation); rouge: ROUGE-1/2/L/Lsum (summarisation)."},
    )
    metrics_dir: str = field(
        default=str(METRICS_DIR), metadata={"help": "Folder of the local evaluate metric modules."}
    )
    max_source_length: int | None = field(
        default=1024,
        metadata={"help": "Drop examples whose input is longer than this many tokens (counted and logged)."},
    )
    max_target_length: int | None = field(
        default=128,
        metadata={
            "help": "Drop examples whose target is longer than this many tokens (counted and logged); also the "
            "default --generation_max_length."
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Use the first N training examples left after filtering."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Use the first N validation examples left after filtering."}
    )
    max_predict_samples: int | None = field(
        default=None, metadata={"help": "Use the first N test examples left after filtering."}
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes for tokenization."}
    )
    dataset_description: str | None = field(
        default=None,
        metadata={"help": "Description of the data for the model card; defaults to the folder, fields and counts."},
    )

    def __post_init__(self) -> None:
        for name in ("max_source_length", "max_target_length", "max_train_samples", "max_eval_samples",
                     "max_predict_samples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name} must be a positive integer, got {value}")
        if self.source_field == self.target_field:
            raise ValueError(f"--source_field and --target_field must differ, both are {self.source_field!r}")


class Seq2SeqTrainerWithCard(Seq2SeqTrainer):
    """``Seq2SeqTrainer`` whose ``create_model_card`` writes the Scaleformer card of ``model_cards/``.

    ``Trainer.push_to_hub`` calls ``create_model_card`` before uploading the output folder, so the pushed
    ``README.md`` is this card rather than Trainer's generic one. Set ``training_run`` first: a function returning
    the run's `TrainingRun`, called each time a card is written.
    """

    training_run: Callable[[], TrainingRun] | None = None

    def create_model_card(self, model_name: str | None = None, **kwargs: Any) -> None:
        """Write ``<output_dir>/README.md``; Trainer's own card options (``kwargs``) do not apply."""
        if not self.is_world_process_zero():
            return
        if self.training_run is None:
            raise ValueError("set `training_run` (the facts of the model card) before creating the card")
        model_id = getattr(self, "hub_model_id", None) or model_name or Path(self.args.output_dir).resolve().name
        write_model_card(self.args.output_dir, self.training_run(), model_id=model_id)


def parse_arguments(
    argv: Sequence[str] | None,
) -> tuple[ModelArguments, DataTrainingArguments, Seq2SeqTrainingArguments]:
    """Parse command-line arguments, or a single ``.json`` file holding them."""
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, Seq2SeqTrainingArguments))
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 1 and argv[0].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file(json_file=os.path.abspath(argv[0]))
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    if not torch.accelerator.is_available():
        # pinned memory only speeds up copies to an accelerator; without one PyTorch ignores it with a warning
        training_args.dataloader_pin_memory = False
    return model_args, data_args, training_args


def load_tokenizer_and_model(
    model_args: ModelArguments,
) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """A tokenizer and either a saved model (fine-tuning) or a new one from a configuration (from scratch)."""
    if model_args.model_name_or_path is None and model_args.config_name is None:
        raise ValueError("give --model_name_or_path (fine-tune a saved model) or --config_name (train from scratch)")
    tokenizer_source = model_args.tokenizer_name or model_args.model_name_or_path
    if tokenizer_source is None:
        raise ValueError("--tokenizer_name is required when training from scratch with --config_name")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source, trust_remote_code=model_args.trust_remote_code)
    if tokenizer.pad_token_id is None:
        raise ValueError(f"the tokenizer of {tokenizer_source!r} (--tokenizer_name) has no pad token")

    if model_args.model_name_or_path is None:
        config = AutoConfig.from_pretrained(
            model_args.config_name, trust_remote_code=model_args.trust_remote_code, **token_config(tokenizer)
        )
        model = AutoModelForSeq2SeqLM.from_config(config, trust_remote_code=model_args.trust_remote_code)
        logger.info("new %s model from %s", type(model).__name__, model_args.config_name)
    else:
        config = AutoConfig.from_pretrained(
            model_args.config_name or model_args.model_name_or_path, trust_remote_code=model_args.trust_remote_code
        )
        model = AutoModelForSeq2SeqLM.from_pretrained(
            model_args.model_name_or_path, config=config, trust_remote_code=model_args.trust_remote_code
        )
        if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
            model.resize_token_embeddings(len(tokenizer))
    if model.config.decoder_start_token_id is None:
        raise ValueError("the model configuration has no `decoder_start_token_id`; set it in --config_name's file")
    logger.info("%s: %.2f M parameters", type(model).__name__, model.num_parameters() / 1e6)
    return tokenizer, model


def prepare_split(
    dataset: datasets.Dataset,
    split: str,
    tokenizer: PreTrainedTokenizerBase,
    data_args: DataTrainingArguments,
    max_samples: int | None,
) -> datasets.Dataset:
    """Tokenize a split, drop empty and over-long examples (logging how many), then keep the first ``max_samples``.

    The returned dataset keeps the source and target text beside ``input_ids``, ``attention_mask`` and
    ``labels``; Trainer drops the text columns, which the model's ``forward`` does not take.
    """
    check_fields(dataset, split, data_args.source_field, data_args.target_field)
    source, target = data_args.source_field, data_args.target_field
    n_read = len(dataset)
    dataset = dataset.filter(lambda s, t: bool(s) and bool(t), input_columns=[source, target],
                             desc=f"dropping empty {split} examples")
    n_empty = n_read - len(dataset)

    def tokenize(batch: dict[str, list]) -> dict[str, list]:
        features = tokenizer(batch[source], truncation=False)
        features["labels"] = tokenizer(text_target=batch[target], truncation=False)["input_ids"]
        return features

    dataset = dataset.map(
        tokenize,
        batched=True,
        num_proc=data_args.preprocessing_num_workers,
        remove_columns=[c for c in dataset.column_names if c not in (source, target)],
        desc=f"tokenizing {split}",
    )
    lengths = LengthFilter.of(
        [len(ids) for ids in dataset["input_ids"]], [len(ids) for ids in dataset["labels"]],
        data_args.max_source_length, data_args.max_target_length,
    )
    dataset = dataset.select(lengths.keep)
    logger.info(
        "%s: read %d examples; dropped %d empty, %d with more than %s source tokens (--max_source_length) and "
        "%d with more than %s target tokens (--max_target_length), %d dropped in all; %d left",
        split, n_read, n_empty, lengths.too_long_source, data_args.max_source_length, lengths.too_long_target,
        data_args.max_target_length, n_read - len(dataset), len(dataset),
    )
    if max_samples is not None and max_samples < len(dataset):
        dataset = dataset.select(range(max_samples))
        logger.info("%s: using the first %d examples", split, max_samples)
    if len(dataset) == 0:
        raise ValueError(
            f"no {split} example is left after filtering; raise --max_source_length/--max_target_length"
        )
    return dataset


def training_run(
    argv: Sequence[str],
    model_args: ModelArguments,
    data_args: DataTrainingArguments,
    training_args: Seq2SeqTrainingArguments,
    trainer: Seq2SeqTrainer,
    prepared: dict[str, datasets.Dataset],
    results: dict[str, float],
    baseline: dict[str, float],
) -> TrainingRun:
    """What the model card states about this run: command, data, settings, timings and results."""
    counts = ", ".join(f"{len(ds)} {split}" for split, ds in prepared.items())
    description = data_args.dataset_description or (
        f"`{data_args.data_dir}`: JSON-lines pairs, `{data_args.source_field}` -> `{data_args.target_field}`; "
        f"examples used: {counts}."
    )
    device = training_args.device
    if device.type == "cuda":
        hardware = f"GPU: {torch.cuda.get_device_name(device)}"
    else:
        hardware = f"{device.type.upper()}, {os.cpu_count()} cores visible, {torch.get_num_threads()} torch threads"
    regime = "bf16 mixed precision" if training_args.bf16 else "fp16 mixed precision" if training_args.fp16 else "fp32"
    hyperparameters = {
        "training regime": f"{regime} on {device.type}",
        "learning_rate": training_args.learning_rate,
        "lr_scheduler_type": getattr(training_args.lr_scheduler_type, "value", training_args.lr_scheduler_type),
        "warmup_steps": training_args.warmup_steps,
        "weight_decay": training_args.weight_decay,
        "optimizer": getattr(training_args.optim, "value", training_args.optim),
        "per_device_train_batch_size": training_args.per_device_train_batch_size,
        "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
        "optimisation steps": trainer.state.global_step,
        "epochs": round(trainer.state.epoch or 0.0, 3),
        "label_smoothing_factor": training_args.label_smoothing_factor,
        "seed": training_args.seed,
        "generation": f"max_length {training_args.generation_max_length}, "
        f"{training_args.generation_num_beams or 1} beam(s)",
    }
    speeds = {
        name: f"{results[name]:.1f} s" if name == "train_runtime" else round(results[name], 3)
        for name in ("train_runtime", "train_samples_per_second", "train_steps_per_second")
        if name in results
    }
    preprocessing = (
        f"Tokenized with `{model_args.tokenizer_name or model_args.model_name_or_path}`, without truncation; empty "
        f"examples and examples longer than {data_args.max_source_length} source or {data_args.max_target_length} "
        "target tokens were dropped (the training log counts them)."
    )
    eval_ds = prepared.get("validation")
    first = prepared.get("train", next(iter(prepared.values())))
    return TrainingRun(
        training_command=f"python {SCRIPT} {shlex.join(argv)}",
        metrics=results_for_card(results),
        dataset_description=description,
        baselines={"copy the source": baseline} if baseline else {},
        pipeline_tag=PIPELINE_TAGS[data_args.metric],
        base_model=model_args.model_name_or_path,
        preprocessing=preprocessing,
        testing_data=(
            f"{len(eval_ds)} examples of `validation.jsonl` (the first left after filtering)."
            if eval_ds is not None else None
        ),
        hyperparameters=hyperparameters,
        speeds=speeds,
        hardware=hardware,
        example_input=first[0][data_args.source_field],
    )


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Run training, evaluation and prediction as asked; return all measured metrics.

    Args:
        argv (`list[str]`, *optional*): command-line arguments (defaults to ``sys.argv[1:]``), or one ``.json`` path.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    model_args, data_args, training_args = parse_arguments(argv)

    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    # this script's own summary at INFO; transformers and datasets at `--log_level` (their warnings by default,
    # `--log_level info` adds the config dumps, file loading and Trainer set-up)
    log_level = training_args.get_process_log_level()
    logger.setLevel(logging.INFO if training_args.should_log else log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()

    if not (training_args.do_train or training_args.do_eval or training_args.do_predict):
        raise ValueError("nothing to do: pass --do_train, --do_eval and/or --do_predict")
    checkpoint = training_args.resume_from_checkpoint
    if checkpoint is not None and not Path(checkpoint).is_dir():
        raise ValueError(f"--resume_from_checkpoint {checkpoint!r} is not a checkpoint folder")
    if training_args.do_train and checkpoint is None and os.path.isdir(training_args.output_dir):
        last = get_last_checkpoint(training_args.output_dir)
        if last is not None:
            logger.warning(
                "%s holds %s; training starts from scratch. Pass --resume_from_checkpoint %s to continue it.",
                training_args.output_dir, last, last,
            )
    if (training_args.do_eval or training_args.do_predict) and not training_args.predict_with_generate:
        logger.warning("without --predict_with_generate only the loss is measured, not %s", data_args.metric)

    set_seed(training_args.seed)
    raw = load_jsonl_splits(data_args.data_dir)
    tokenizer, model = load_tokenizer_and_model(model_args)

    splits = {"train": training_args.do_train, "validation": training_args.do_eval, "test": training_args.do_predict}
    limits = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples,
              "test": data_args.max_predict_samples}
    prepared: dict[str, datasets.Dataset] = {}
    for split, wanted in splits.items():
        if not wanted:
            continue
        if split not in raw:
            raise ValueError(f"--data_dir {data_args.data_dir!r} has no {split}.jsonl, needed by {SPLIT_FLAGS[split]}")
        with training_args.main_process_first(desc=f"{split} preprocessing"):
            prepared[split] = prepare_split(raw[split], split, tokenizer, data_args, limits[split])

    score = text_scorer(data_args.metric, data_args.metrics_dir)

    def score_texts(predictions: list[str], references: list[str]) -> dict[str, float]:
        return {name: round(value, 4) for name, value in score(predictions, references).items()}

    def compute_metrics(eval_preds: EvalPrediction) -> dict[str, float]:
        predictions, labels = eval_preds.predictions, eval_preds.label_ids
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        predictions = np.where(predictions != -100, predictions, tokenizer.pad_token_id)
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        result = score_texts(
            tokenizer.batch_decode(predictions, skip_special_tokens=True),
            tokenizer.batch_decode(labels, skip_special_tokens=True),
        )
        result["gen_len"] = float(np.mean(np.count_nonzero(predictions != tokenizer.pad_token_id, axis=1)))
        return result

    if training_args.generation_max_length is None:
        training_args.generation_max_length = data_args.max_target_length

    text_columns = [data_args.source_field, data_args.target_field]
    trainer_inputs = {split: ds.remove_columns(text_columns) for split, ds in prepared.items()}
    results: dict[str, float] = {}
    baseline: dict[str, float] = {}
    copy_metrics: dict[str, float] = {}
    if "validation" in prepared:
        eval_texts = prepared["validation"]
        copy = score_texts(eval_texts[data_args.source_field], eval_texts[data_args.target_field])
        baseline = {f"eval_{name}": value for name, value in copy.items()}
        copy_metrics = {f"copy_source_{name}": value for name, value in copy.items()}

    trainer = Seq2SeqTrainerWithCard(
        model=model,
        args=training_args,
        train_dataset=trainer_inputs.get("train"),
        eval_dataset=trainer_inputs.get("validation"),
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        compute_metrics=compute_metrics if training_args.predict_with_generate else None,
    )
    # read when the card is written: at the end, and at each push of --push_to_hub (results so far)
    trainer.training_run = lambda: training_run(
        argv, model_args, data_args, training_args, trainer, prepared, results, baseline
    )
    if copy_metrics:
        trainer.log_metrics("copy_source", copy_metrics)
        trainer.save_metrics("copy_source", copy_metrics)

    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        metrics = dict(train_result.metrics, train_samples=len(prepared["train"]))
        results.update(metrics)
        trainer.save_model()
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    if training_args.do_eval:
        metrics = trainer.evaluate(metric_key_prefix="eval")
        metrics["eval_samples"] = len(prepared["validation"])
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
        results.update(metrics)

    if training_args.do_predict:
        prediction = trainer.predict(trainer_inputs["test"], metric_key_prefix="predict")
        metrics = dict(prediction.metrics, predict_samples=len(prepared["test"]))
        trainer.log_metrics("predict", metrics)
        trainer.save_metrics("predict", metrics)
        results.update(metrics)
        if training_args.predict_with_generate and trainer.is_world_process_zero():
            tokens = np.where(prediction.predictions != -100, prediction.predictions, tokenizer.pad_token_id)
            texts = [t.strip() for t in tokenizer.batch_decode(tokens, skip_special_tokens=True)]
            path = Path(training_args.output_dir) / "generated_predictions.txt"
            path.write_text("".join(f"{t}\n" for t in texts), encoding="utf-8")

    if training_args.do_train:
        if training_args.push_to_hub:
            trainer.push_to_hub(commit_message="End of training")
        else:
            trainer.create_model_card()
    return dict(results, **copy_metrics)


if __name__ == "__main__":
    main()
