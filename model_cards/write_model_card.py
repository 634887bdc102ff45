"""Write the model card (``README.md``) of a trained Scaleformer folder, and push it to the Hub.

The card is rendered from ``template.md`` in this folder, a shortened form of huggingface_hub's
``modelcard_template.md`` in which every section is filled from data or left out: the architecture is
read from the folder's ``config.json``, the parameter count from its safetensors weights, and the data,
training command and metrics are given by the caller. The metadata block is a ``ModelCardData``.

    python model_cards/write_model_card.py outputs/bible-run \\
        --training_command "python examples/run_seq2seq.py ..." \\
        --metrics_file outputs/bible-run/eval_results.json \\
        --dataset_description "English -> Spanish Bible verses (examples/data/bible)"

``examples/run_seq2seq.py`` calls :func:`write_model_card` at the end of training. ``PreTrainedModel.push_to_hub``
writes the card that the Hub repository already holds (or a generic one for a new repository), not the
local ``README.md``; :func:`push_model_card` uploads the local card, so push it after the model and tokenizer
(later pushes of the model keep it, since they start from the card on the Hub).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import huggingface_hub
import torch
import transformers
from huggingface_hub import CommitInfo, CommitOperationAdd, ModelCard, ModelCardData
from safetensors import safe_open
from transformers.utils import hub as transformers_hub

from modeling_scaleformer.ops_registry import SOFTMAX_TYPES


TEMPLATE_PATH = Path(__file__).with_name("template.md")
BASE_TAGS: tuple[str, ...] = ("scaleformer", "custom_code")
KERNELIZED = "kernelized (scores phi(q).phi(k) with phi(x) = elu(x) + 1, normalised by their sum)"
ATTENTION_TEXT = {  # what each `attention_type` computes; {h} is the horizon
    "kernelized_rpe": KERNELIZED + " plus a relative-position term with positions clipped to [-{h}, {h}]",
    "kernelized": KERNELIZED + " with no relative-position term",
    "fourier": KERNELIZED + " with a learned cosine kernel of the relative position",
    "toeplitz": KERNELIZED + " times a learned relative bias exp(b), offsets clipped to [-{h}, {h}], by FFT",
    "xl_relative": "Transformer-XL relative softmax attention, offsets clipped to [-{h}, {h}]",
    "shaw_softmax": "softmax attention with relative keys clipped to [-{h}, {h}] (Shaw et al. 2018)",
    "softmax": "softmax attention with no relative-position term",
}
CLIPPED_TYPES: tuple[str, ...] = ("kernelized_rpe", "toeplitz", "xl_relative", "shaw_softmax")
PIPELINE_TASKS = {
    "translation": "translation",
    "summarization": "summarisation",
    "text2text-generation": "text-to-text generation",
    "text-generation": "text generation",
}
ARCHITECTURE_FIELDS: tuple[str, ...] = (
    "model_type",
    "is_encoder_decoder",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "activation_function",
    "attention_type",
    "attention_mode",
    "rpe_horizon",
    "rpe_shared_across_heads",
    "cross_attention_rpe",
    "absolute_positions",
    "layer_norm_position",
    "vocab_size",
    "tie_word_embeddings",
    "dropout",
    "attention_dropout",
    "activation_dropout",
)
METRIC_DESCRIPTIONS = {
    "bleu": "corpus BLEU of sacreBLEU (default `13a` tokenization, exponential smoothing), 0-100",
    "chrf": "chrF of sacreBLEU (character 6-grams, beta 2), 0-100",
    "rouge1": "ROUGE-1 F-measure of `rouge_score`, times 100",
    "rouge2": "ROUGE-2 F-measure of `rouge_score`, times 100",
    "rougeL": "ROUGE-L (longest common subsequence) F-measure of `rouge_score`, times 100",
    "rougeLsum": "ROUGE-Lsum (sentences split at newlines) F-measure of `rouge_score`, times 100",
    "exact_match": "fraction of outputs identical to the reference",
    "train_loss": "mean training loss (cross-entropy per target token, nats) over all optimisation steps",
    "loss": "cross-entropy per target token (nats), teacher forcing",
    "gen_len": "mean length of the generated outputs in tokens",
    "samples": "number of examples",
}
SPLIT_PREFIXES: tuple[str, ...] = ("eval_", "predict_", "test_", "train_")


def format_metric_value(value: float | int) -> str:
    """Format a metric for the card: integers as they are, floats with four significant digits, no exponent.

    Args:
        value (`float` or `int`): the value.

    Returns:
        `str`: e.g. ``35.43`` for 35.4321, ``0.001230`` for 0.00123, ``12346`` for 12345.6.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"`value` must be a number, got {value!r}")
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    decimals = max(0, 3 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def weight_files(model_dir: str | os.PathLike) -> list[Path]:
    """The safetensors files of a saved model: ``model.safetensors`` or the shards named by its index.

    Raises:
        ValueError: when ``model_dir`` holds neither.
    """
    root = Path(model_dir)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        return [root / shard for shard in shards]
    single = root / "model.safetensors"
    if single.is_file():
        return [single]
    raise ValueError(f"`model_dir` {str(root)!r} holds no model.safetensors or model.safetensors.index.json")


def count_parameters(model_dir: str | os.PathLike) -> int:
    """Number of stored parameters, read from the safetensors headers without loading the weights.

    ``save_pretrained`` stores tied weights once, so this equals ``model.num_parameters()``.

    Args:
        model_dir (`str` or `os.PathLike`): a folder written by ``save_pretrained``.

    Returns:
        `int`: the total number of elements of all stored tensors.
    """
    total = 0
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt") as weights:
            for name in weights.keys():
                total += math.prod(weights.get_slice(name).get_shape())
    return total


def _weights_dtypes(model_dir: str | os.PathLike) -> list[str]:
    dtypes: set[str] = set()
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt") as weights:
            dtypes.update(weights.get_slice(name).get_dtype() for name in weights.keys())
    return sorted(dtypes)


def _model_specs(config: Mapping, n_parameters: int) -> str:
    """One paragraph on the architecture and the training objective, from ``config.json``."""
    millions = f"{n_parameters / 1e6:.2f} M parameters"
    if config.get("model_type") != "scaleformer":
        return f"A `{config.get('model_type')}` model ({millions})."
    if config.get("is_encoder_decoder", True):
        shape = (
            f"Encoder-decoder with {config['encoder_layers']} encoder and {config['decoder_layers']} decoder layers "
            f"({config.get('layer_norm_position', 'pre')}-norm), width {config['d_model']}, "
            f"{config['encoder_attention_heads']} encoder and "
            f"{config['decoder_attention_heads']} decoder attention heads ({millions})"
        )
        objective = (
            "Trained with token-level cross-entropy on the target given the source (teacher forcing); the decoder "
            "reads the labels shifted right behind `decoder_start_token_id`."
        )
    else:
        shape = (
            f"Decoder-only stack of {config['decoder_layers']} layers "
            f"({config.get('layer_norm_position', 'pre')}-norm), width {config['d_model']}, "
            f"{config['decoder_attention_heads']} attention heads ({millions})"
        )
        objective = "Trained with next-token cross-entropy."
    attention_type = config.get("attention_type", "kernelized_rpe")
    attention = "Attention is " + ATTENTION_TEXT[attention_type].format(h=config.get("rpe_horizon"))
    if attention_type not in SOFTMAX_TYPES:
        attention += ("; it costs time linear in the sequence length, and generation keeps a state of constant "
                      "size instead of a growing key/value cache")
    else:
        attention += "; it costs time quadratic in the sequence length, and generation keeps a key/value cache"
    if config.get("absolute_positions"):
        attention += f". {config['absolute_positions'].capitalize()} absolute positions are added to the embeddings"
    elif attention_type in ("kernelized", "softmax"):
        attention += ". There are no absolute position embeddings either: the model has no position information"
    else:
        attention += ". There are no absolute position embeddings"
    tied = " Input embeddings and output projection are shared." if config.get("tie_word_embeddings") else ""
    return f"{shape}. {attention}.{tied} {objective}"


def _default_limitations(config: Mapping) -> list[str]:
    attention_type = config.get("attention_type", "kernelized_rpe")
    items = []
    if attention_type not in SOFTMAX_TYPES:
        items.append(
            "Kernelized attention is not softmax attention: a weight is phi(q).phi(k) over its row sum, with no "
            "exponential, so sharply focused (near one-hot) attention is harder to express, and the weights of "
            "softmax-attention models do not carry over."
        )
    else:
        items.append(
            f"`attention_type={attention_type!r}` is softmax attention: its time and memory grow quadratically with "
            "the input length, and so does its key/value cache during generation."
        )
    if attention_type in CLIPPED_TYPES:
        horizon = config.get("rpe_horizon")
        beyond = (" except through the absolute positions added to the embeddings" if config.get("absolute_positions")
                  else "")
        items.append(
            f"Relative positions are clipped at a horizon of {horizon} tokens: keys farther away than that share "
            f"one relative embedding, so one attention layer cannot tell positions beyond the horizon apart{beyond}."
        )
    elif attention_type in ("kernelized", "softmax") and not config.get("absolute_positions"):
        items.append(
            f"This model uses no position information (`attention_type={attention_type!r}` without absolute "
            "positions): its encoder sees the input as a bag of tokens."
        )
    items += [
        "Small model trained on a small CPU budget on a small corpus: the scores below are those of a "
        "demonstration, far below production translation or summarisation systems, and the outputs are often "
        "wrong.",
        "transformers 5 removed the `translation`, `summarization` and `text2text-generation` pipelines; use "
        "the tokenizer and `generate()` as shown below.",
        "Loading runs the modeling code stored in the repository (`trust_remote_code=True`); read it first.",
    ]
    return items


def _metric_descriptions(names: Sequence[str]) -> str:
    lines = []
    seen: set[str] = set()
    for name in names:
        base = name
        if name not in METRIC_DESCRIPTIONS:
            for prefix in SPLIT_PREFIXES:
                if name.startswith(prefix):
                    base = name[len(prefix) :]
                    break
        if base in METRIC_DESCRIPTIONS and base not in seen:
            seen.add(base)
            lines.append(f"- `{base}`: {METRIC_DESCRIPTIONS[base]}")
    prefixes = "`eval_` (validation split), `predict_` (test split), `train_` (training)"
    return "\n".join(lines + [f"\nPrefixes name the split: {prefixes}."]) if lines else f"Prefixes: {prefixes}."


def _get_started_code(model_id: str, config: Mapping, example_input: str) -> str:
    auto_class = "AutoModelForSeq2SeqLM" if config.get("is_encoder_decoder", True) else "AutoModelForCausalLM"
    return (
        f"from transformers import {auto_class}, AutoTokenizer\n\n"
        f'tokenizer = AutoTokenizer.from_pretrained("{model_id}", trust_remote_code=True)\n'
        f'model = {auto_class}.from_pretrained("{model_id}", trust_remote_code=True)\n'
        f"inputs = tokenizer([{json.dumps(example_input, ensure_ascii=False)}], return_tensors=\"pt\")\n"
        "outputs = model.generate(**inputs, max_new_tokens=64)\n"
        "print(tokenizer.batch_decode(outputs, skip_special_tokens=True)[0])"
    )


def _check_metrics(name: str, metrics: Mapping) -> dict[str, float | int]:
    if not isinstance(metrics, Mapping) or not metrics:
        raise ValueError(f"`{name}` must be a non-empty dict of metric name -> number, got {metrics!r}")
    bad = {k: v for k, v in metrics.items() if isinstance(v, bool) or not isinstance(v, (int, float))}
    if bad:
        raise ValueError(f"`{name}` must map metric names to numbers, got {bad}")
    return dict(metrics)


def write_model_card(
    model_dir: str | os.PathLike,
    *,
    training_command: str,
    metrics: Mapping[str, float | int],
    dataset_description: str,
    limitations: Sequence[str] | None = None,
    baselines: Mapping[str, Mapping[str, float | int]] | None = None,
    model_id: str | None = None,
    pipeline_tag: str = "text2text-generation",
    tags: Sequence[str] | None = None,
    datasets: Sequence[str] | None = None,
    metric_names: Sequence[str] | None = None,
    language: Sequence[str] | None = None,
    base_model: str | None = None,
    preprocessing: str | None = None,
    testing_data: str | None = None,
    hyperparameters: Mapping[str, object] | None = None,
    training_regime: str = "fp32",
    speeds_sizes_times: Mapping[str, object] | None = None,
    hardware: str | None = None,
    example_input: str = "In the beginning God created the heaven and the earth.",
    results_summary: str | None = None,
    template_path: str | os.PathLike = TEMPLATE_PATH,
) -> Path:
    """Render the model card of a saved model folder and write it as ``<model_dir>/README.md``.

    Args:
        model_dir (`str` or `os.PathLike`):
            A folder written by ``save_pretrained``: ``config.json`` and safetensors weights.
        training_command (`str`):
            The command that trained the model, shown verbatim.
        metrics (`dict[str, float | int]`):
            Measured metrics, e.g. ``{"eval_bleu": 3.1, "eval_chrf": 21.4, "eval_loss": 4.2}``; one table row each.
        dataset_description (`str`):
            What the training data is (source, size, split, filtering).
        limitations (`list[str]`, *optional*):
            Items added after the built-in limitations (kernelized vs softmax attention, position horizon,
            training budget, pipelines, remote code).
        baselines (`dict[str, dict[str, float | int]]`, *optional*):
            Extra result columns, e.g. ``{"copy the source": {"eval_bleu": 1.2}}``; missing entries show "-".
        model_id (`str`, *optional*):
            The repository id used in the title and the loading code; defaults to the folder's name.
        pipeline_tag (`str`, *optional*, defaults to `"text2text-generation"`):
            Hub task tag, e.g. ``"translation"`` or ``"summarization"``.
        tags (`list[str]`, *optional*):
            Tags added to ``scaleformer``, ``custom_code``, the attention family's (``kernelized-attention`` and
            ``linear-attention``, or ``softmax-attention``) and the model kind.
        datasets (`list[str]`, *optional*):
            Hub dataset ids for the metadata (only real Hub ids belong here).
        metric_names (`list[str]`, *optional*):
            Hub metric ids for the metadata, e.g. ``["sacrebleu", "chrf"]``.
        language (`list[str]`, *optional*):
            Language codes, e.g. ``["en", "es"]``.
        base_model (`str`, *optional*):
            The model this one was fine-tuned from: a Hub id (also written to the metadata) or a local folder
            (named in the text only, since the Hub's `base_model` field takes repository ids).
        preprocessing (`str`, *optional*):
            Tokenization and filtering of the data.
        testing_data (`str`, *optional*):
            The evaluation data; defaults to a pointer to the training data description.
        hyperparameters (`dict[str, object]`, *optional*):
            Listed under "Training Hyperparameters".
        training_regime (`str`, *optional*, defaults to `"fp32"`):
            Precision and device of training.
        speeds_sizes_times (`dict[str, object]`, *optional*):
            Runtime and throughput; the parameter count and weight size are always listed.
        hardware (`str`, *optional*):
            Where the model was trained.
        example_input (`str`, *optional*):
            Source text of the loading example.
        results_summary (`str`, *optional*):
            A sentence under the results table.
        template_path (`str` or `os.PathLike`, *optional*):
            The Jinja template, ``model_cards/template.md`` by default.

    Returns:
        `Path`: the written ``README.md``.

    Raises:
        ValueError: when the folder has no ``config.json`` or weights, or an argument is empty or malformed.
    """
    root = Path(model_dir)
    config_path = root / "config.json"
    if not config_path.is_file():
        raise ValueError(f"`model_dir` {str(root)!r} holds no config.json")
    if not training_command or not training_command.strip():
        raise ValueError("`training_command` must be a non-empty string")
    if not dataset_description or not dataset_description.strip():
        raise ValueError("`dataset_description` must be a non-empty string")
    if pipeline_tag not in PIPELINE_TASKS:
        raise ValueError(f"`pipeline_tag` must be one of {sorted(PIPELINE_TASKS)}, got {pipeline_tag!r}")
    metrics = _check_metrics("metrics", metrics)
    baselines = {name: _check_metrics(f"baselines[{name!r}]", values) for name, values in (baselines or {}).items()}

    config = json.loads(config_path.read_text(encoding="utf-8"))
    n_parameters = count_parameters(root)
    weights_bytes = sum(path.stat().st_size for path in weight_files(root))
    model_id = model_id or root.resolve().name
    task = PIPELINE_TASKS[pipeline_tag]
    kind = "encoder-decoder" if config.get("is_encoder_decoder", True) else "decoder-only"
    linear = config.get("attention_type", "kernelized_rpe") not in SOFTMAX_TYPES
    family_tags = ["kernelized-attention", "linear-attention"] if linear else ["softmax-attention"]
    attention_summary = "linear-time kernelized attention" if linear else "softmax attention"

    architecture = {name: config[name] for name in ARCHITECTURE_FIELDS if name in config}
    architecture["parameters"] = f"{n_parameters:,}"
    architecture["weights dtype"] = ", ".join(_weights_dtypes(root))
    sizes = {
        "parameters": f"{n_parameters:,} ({n_parameters / 1e6:.2f} M)",
        "weights": f"{weights_bytes / 2**20:.1f} MiB (safetensors)",
    }
    sizes.update(speeds_sizes_times or {})

    columns = ["this model", *baselines]
    rows = [
        [name, format_metric_value(value)]
        + [format_metric_value(b[name]) if name in b else "-" for b in baselines.values()]
        for name, value in metrics.items()
    ]

    card_data = ModelCardData(
        license="apache-2.0",
        library_name="transformers",
        tags=list(dict.fromkeys([*BASE_TAGS, *family_tags, kind, *(tags or [])])),
        pipeline_tag=pipeline_tag,
        datasets=list(datasets) if datasets else None,
        metrics=list(metric_names) if metric_names else None,
        language=list(language) if language else None,
        base_model=None if base_model is None or Path(base_model).exists() else base_model,
    )
    card = ModelCard.from_template(
        card_data,
        template_path=str(template_path),
        model_id=model_id,
        finetuned_from=base_model,
        model_summary=(
            f"A {n_parameters / 1e6:.2f} M-parameter Scaleformer {kind} model for {task}, with "
            f"{attention_summary}, trained with the Scaleformer example scripts."
        ),
        model_description=(
            f"Scaleformer {kind} ({config.get('model_type')}) in the Hugging Face Transformers format. The "
            "modeling code is stored next to the weights, so the model loads with `trust_remote_code=True` "
            "where the `modeling_scaleformer` package is not installed."
        ),
        model_type=f"{kind} transformer with {'kernelized' if linear else 'softmax'} attention "
        f"(`{config.get('model_type')}`)",
        direct_use=(
            f"{task.capitalize()} of inputs like the training data; a reference point for linear-time attention "
            "experiments rather than a production model."
        ),
        out_of_scope_use="Inputs unlike the training data, and any use where wrong outputs cause harm.",
        limitations=[*_default_limitations(config), *(limitations or [])],
        get_started_code=_get_started_code(model_id, config, example_input),
        training_data=dataset_description.strip(),
        preprocessing=preprocessing,
        training_command=training_command.strip(),
        training_regime=training_regime,
        hyperparameters=dict(hyperparameters or {}),
        speeds_sizes_times=sizes,
        testing_data=testing_data or "The evaluation split of the data described under Training Data.",
        testing_metrics=_metric_descriptions(list(metrics)),
        results_columns=columns,
        results_rows=rows,
        results_summary=results_summary,
        model_specs=_model_specs(config, n_parameters),
        architecture=architecture,
        hardware=hardware,
        software=(
            f"transformers {transformers.__version__}, torch {torch.__version__}, "
            f"huggingface_hub {huggingface_hub.__version__}; modeling code: "
            + ", ".join(f"`{path.name}`" for path in sorted(root.glob("*.py")))
        ),
    )
    path = root / "README.md"
    card.save(path)
    return path


def push_model_card(
    model_dir: str | os.PathLike,
    repo_id: str,
    *,
    token: str | bool | None = None,
    revision: str | None = None,
    commit_message: str = "Upload model card",
) -> CommitInfo:
    """Upload ``<model_dir>/README.md`` to a Hub repository, through transformers' shared ``HfApi``.

    Args:
        model_dir (`str` or `os.PathLike`): a folder holding a card written by :func:`write_model_card`.
        repo_id (`str`): the repository, e.g. ``"user/scaleformer-bible"``; it must exist (push the model first).
        token (`str` or `bool`, *optional*): Hub token, as for ``push_to_hub``.
        revision (`str`, *optional*): the branch to commit to.
        commit_message (`str`, *optional*): the commit message.

    Returns:
        `CommitInfo`: what ``HfApi.create_commit`` returns.

    Raises:
        ValueError: when the folder holds no ``README.md``.
    """
    card_path = Path(model_dir) / "README.md"
    if not card_path.is_file():
        raise ValueError(f"`model_dir` {str(model_dir)!r} holds no README.md; run write_model_card first")
    return transformers_hub.hf_api().create_commit(
        repo_id=repo_id,
        operations=[CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=str(card_path))],
        commit_message=commit_message,
        token=token,
        revision=revision,
    )


def _read_metrics_file(path: str) -> dict[str, float | int]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    skipped = ("_runtime", "_per_second", "_flos")
    return {
        key: value
        for key, value in data.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not key.endswith(skipped)
    }


def main(argv: Sequence[str] | None = None) -> Path:
    """Command line: write the card of a folder from a metrics JSON file (``all_results.json`` or similar)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", help="folder written by save_pretrained")
    parser.add_argument("--training_command", required=True)
    parser.add_argument("--metrics_file", required=True, help="JSON of metric name -> number (e.g. eval_results.json)")
    parser.add_argument("--dataset_description", required=True)
    parser.add_argument("--baseline_file", help="JSON of the same metrics for a baseline")
    parser.add_argument("--baseline_name", default="copy the source")
    parser.add_argument("--limitation", action="append", default=[], help="extra limitation (repeatable)")
    parser.add_argument("--model_id")
    parser.add_argument("--pipeline_tag", default="text2text-generation", choices=sorted(PIPELINE_TASKS))
    parser.add_argument("--tag", action="append", default=[])
    parser.add_argument("--language", action="append", default=[])
    parser.add_argument("--hardware")
    args = parser.parse_args(argv)
    baselines = {args.baseline_name: _read_metrics_file(args.baseline_file)} if args.baseline_file else None
    path = write_model_card(
        args.model_dir,
        training_command=args.training_command,
        metrics=_read_metrics_file(args.metrics_file),
        dataset_description=args.dataset_description,
        limitations=args.limitation,
        baselines=baselines,
        model_id=args.model_id,
        pipeline_tag=args.pipeline_tag,
        tags=args.tag,
        language=args.language,
        hardware=args.hardware,
    )
    print(path)
    return path


if __name__ == "__main__":
    main()
