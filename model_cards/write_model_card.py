"""Write the model card (``README.md``) of a trained Scaleformer folder, and push it to the Hub.

``template.md`` holds the sections of huggingface_hub's ``modelcard_template.md`` that a run can fill, with no
"More information needed" stubs. A `TrainingRun` gives what the training script knows (command, data, settings,
results); the folder gives the rest: the architecture from ``config.json`` and the attention registry, the
parameter count and weight size from the safetensors headers, the modeling code stored beside them.

    python model_cards/write_model_card.py outputs/bible-run \\
        --training_command "python examples/run_seq2seq.py ..." \\
        --metrics_file outputs/bible-run/eval_results.json \\
        --dataset_description "English -> Spanish Bible verses (examples/data/bible)"

``PreTrainedModel.push_to_hub`` writes the card that the Hub repository already holds (or a generic one for a new
repository), not the local ``README.md``; :func:`push_model_card` uploads the local card, so push it after the model
and tokenizer (later pushes of the model keep it, since they start from the card on the Hub).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import huggingface_hub
import torch
import transformers
from huggingface_hub import CommitInfo, CommitOperationAdd, ModelCard, ModelCardData
from safetensors import safe_open
from transformers.utils import hub as transformers_hub

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: examples.*, model_cards.*

from modeling_scaleformer.ops_registry import AttentionVariant, get_attention_variant  # noqa: E402


TEMPLATE_PATH = Path(__file__).with_name("template.md")
PIPELINE_TASKS = {
    "translation": "translation",
    "summarization": "summarisation",
    "text2text-generation": "text-to-text generation",
    "text-generation": "text generation",
}
KERNELIZED = "kernelized (scores phi(q).phi(k) with phi(x) = elu(x) + 1, normalised by their sum)"
# how the card words each registered attention type ({h} is the horizon); what it costs, what generation keeps
# and which positions it sees are the registry's facts
ATTENTION_WORDS = {
    "kernelized_rpe": KERNELIZED + " plus a relative-position term with positions clipped to [-{h}, {h}]",
    "kernelized": KERNELIZED + " with no relative-position term",
    "kernelized_decay": KERNELIZED + " plus a relative-position term with positions clipped to [-{h}, {h}], each "
    "weight times a learned per-head geometric decay beyond the horizon",
    "kernelized_decay_gated": "kernelized attention with relative positions clipped to [-{h}, {h}] and a learned "
    "per-head geometric decay beyond the horizon, summed without a row normaliser, then a per-head RMSNorm and a "
    "SiLU output gate",
    "kernelized_gated": "kernelized attention with a learned per-head geometric decay of the weights with distance "
    "and no relative-position table, summed without a row normaliser, then a per-head RMSNorm and a SiLU output "
    "gate",
    "kernelized_sum": "kernelized attention with no decay and no position information, summed without a row "
    "normaliser, then a per-head RMSNorm and a SiLU output gate",
    "local_softmax_decay": "softmax attention over the nearest keys, with relative keys clipped to [-{h}, {h}] (Shaw "
    "et al. 2018), and kernelized attention (phi(x) = elu(x) + 1) with a learned per-head geometric decay beyond "
    "them, under one row normaliser",
    "fourier": KERNELIZED + " with a learned cosine kernel of the relative position",
    "toeplitz": KERNELIZED + " times a learned relative bias exp(b), offsets clipped to [-{h}, {h}], by FFT",
    "xl_relative": "Transformer-XL relative softmax attention, offsets clipped to [-{h}, {h}]",
    "shaw_softmax": "softmax attention with relative keys clipped to [-{h}, {h}] (Shaw et al. 2018)",
    "softmax": "softmax attention with no relative-position term",
}
ARCHITECTURE_FIELDS: tuple[str, ...] = (
    "model_type", "is_encoder_decoder", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
    "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "activation_function", "attention_type",
    "attention_mode", "rpe_horizon", "rpe_shared_across_heads", "cross_attention_rpe", "feature_map",
    "decoder_attention", "absolute_positions",
    "layer_norm_position", "vocab_size", "tie_word_embeddings", "dropout", "attention_dropout", "activation_dropout",
)
METRICS = {  # metric (without its split prefix) -> (Hub metric id, what it is)
    "bleu": ("sacrebleu", "corpus BLEU of sacreBLEU (default `13a` tokenization, exponential smoothing), 0-100"),
    "chrf": ("chrf", "chrF of sacreBLEU (character 6-grams, beta 2), 0-100"),
    "rouge1": ("rouge", "ROUGE-1 F-measure of `rouge_score`, times 100"),
    "rouge2": ("rouge", "ROUGE-2 F-measure of `rouge_score`, times 100"),
    "rougeL": ("rouge", "ROUGE-L (longest common subsequence) F-measure of `rouge_score`, times 100"),
    "rougeLsum": ("rouge", "ROUGE-Lsum (sentences split at newlines) F-measure of `rouge_score`, times 100"),
    "exact_match": ("exact_match", "fraction of outputs identical to the reference"),
    "train_loss": (None, "mean training loss (cross-entropy per target token, nats) over all optimisation steps"),
    "loss": (None, "cross-entropy per target token (nats), teacher forcing"),
    "gen_len": (None, "mean length of the generated outputs in tokens"),
    "samples": (None, "number of examples"),
}
SPLIT_PREFIXES: tuple[str, ...] = ("eval_", "predict_", "test_", "train_")
TIMINGS: tuple[str, ...] = ("_runtime", "_per_second", "_flos")  # per-call timings and throughput, not results


def _check_metrics(name: str, metrics: Mapping) -> None:
    if not isinstance(metrics, Mapping) or not metrics:
        raise ValueError(f"`{name}` must be a non-empty dict of metric name -> number, got {metrics!r}")
    bad = {k: v for k, v in metrics.items() if isinstance(v, bool) or not isinstance(v, (int, float))}
    if bad:
        raise ValueError(f"`{name}` must map metric names to numbers, got {bad}")


@dataclass
class TrainingRun:
    """What a training script knows about its run. The card states every field that is given and leaves out the
    sections of those that are not; the architecture, the size and the software it reads from the model folder."""

    training_command: str  # shown verbatim
    metrics: dict[str, float | int]  # e.g. {"eval_bleu": 3.1, "eval_loss": 4.2}: a row of the results table each
    dataset_description: str  # what the training data is: source, size, split, filtering
    # extra result columns, e.g. {"copy the source": {"eval_bleu": 1.2}}; "-" where a metric is missing
    baselines: dict[str, dict[str, float | int]] = field(default_factory=dict)
    pipeline_tag: str = "text2text-generation"  # the Hub task, a key of PIPELINE_TASKS
    language: list[str] = field(default_factory=list)  # language codes, e.g. ["en", "es"]
    # the model this one was fine-tuned from: a Hub id (also written to the metadata) or a local folder (named in
    # the text only, since the Hub's `base_model` field takes repository ids)
    base_model: str | None = None
    preprocessing: str | None = None  # tokenization and filtering of the data
    testing_data: str | None = None  # the evaluation data; the card points at the training data otherwise
    hyperparameters: dict[str, object] = field(default_factory=dict)  # the training regime (precision, device) first
    speeds: dict[str, object] = field(default_factory=dict)  # runtime and throughput
    hardware: str | None = None  # where the model was trained
    example_input: str = "In the beginning God created the heaven and the earth."  # of the loading example
    limitations: list[str] = field(default_factory=list)  # after those that the architecture implies
    tags: list[str] = field(default_factory=list)  # Hub tags, after scaleformer, custom_code and the architecture's

    def __post_init__(self) -> None:
        for name in ("training_command", "dataset_description"):
            if not getattr(self, name) or not getattr(self, name).strip():
                raise ValueError(f"`{name}` must be a non-empty string")
        if self.pipeline_tag not in PIPELINE_TASKS:
            raise ValueError(f"`pipeline_tag` must be one of {sorted(PIPELINE_TASKS)}, got {self.pipeline_tag!r}")
        _check_metrics("metrics", self.metrics)
        for name, values in self.baselines.items():
            _check_metrics(f"baselines[{name!r}]", values)


def results_for_card(results: Mapping[str, object]) -> dict[str, float | int]:
    """The results worth a row in the card: the numbers, without timings and the epoch counter."""
    return {
        name: value
        for name, value in results.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and name != "epoch"
        and not name.endswith(TIMINGS)
    }


def format_metric_value(value: float | int) -> str:
    """Format a metric for the card: integers as they are, floats with four significant digits, no exponent.

    Returns:
        `str`: e.g. ``35.43`` for 35.4321, ``0.001230`` for 0.00123, ``12346`` for 12345.6.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"`value` must be a number, got {value!r}")
    if isinstance(value, int) or not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    decimals = max(0, 3 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def weight_files(model_dir: str | os.PathLike) -> list[Path]:
    """The safetensors files of a saved model: ``model.safetensors`` or the shards named by its index."""
    root = Path(model_dir)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        shards = json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()
        return [root / shard for shard in sorted(set(shards))]
    if (root / "model.safetensors").is_file():
        return [root / "model.safetensors"]
    raise ValueError(f"`model_dir` {str(root)!r} holds no model.safetensors or model.safetensors.index.json")


def _tensor_shapes_and_dtypes(model_dir: str | os.PathLike) -> list[tuple[list[int], str]]:
    found = []
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt") as weights:
            slices = [weights.get_slice(name) for name in weights.keys()]
            found += [(tensor.get_shape(), tensor.get_dtype()) for tensor in slices]
    return found


def count_parameters(model_dir: str | os.PathLike) -> int:
    """Number of stored parameters, read from the safetensors headers without loading the weights.

    ``save_pretrained`` stores tied weights once, so this equals ``model.num_parameters()``.
    """
    return sum(math.prod(shape) for shape, _ in _tensor_shapes_and_dtypes(model_dir))


def clips_positions(variant: AttentionVariant) -> bool:
    """Whether the variant learns a table over the relative offsets [-h, h]: its parameters grow with the horizon."""
    return variant.parameters(1, 1, 1, False) != variant.parameters(1, 1, 2, False)


def sees_relative_positions(variant: AttentionVariant) -> bool:
    """Whether the variant has a relative-position term: the parameters a variant adds to the projections are it."""
    return bool(variant.parameters(1, 1, 1, False))


def parameter_phrase(n_parameters: int) -> str:
    """"A 7.61 M-parameter" or "An 8.09 M-parameter": the size with the article its spoken number takes."""
    size = f"{n_parameters / 1e6:.2f}"
    whole = size.split(".")[0]
    vowel_sound = whole.startswith("8") or whole in ("11", "18")  # eight..., eighty..., eleven, eighteen
    return f"{'An' if vowel_sound else 'A'} {size} M-parameter"


def architecture_paragraph(config: Mapping, n_parameters: int) -> str:
    """One paragraph on the architecture and the training objective, from ``config.json`` and the registry."""
    variant = get_attention_variant(config["attention_type"])
    size, norm = f"{n_parameters / 1e6:.2f} M parameters", config["layer_norm_position"]
    if config["is_encoder_decoder"]:
        shape = (
            f"Encoder-decoder with {config['encoder_layers']} encoder and {config['decoder_layers']} decoder layers "
            f"({norm}-norm), width {config['d_model']}, {config['encoder_attention_heads']} encoder and "
            f"{config['decoder_attention_heads']} decoder attention heads ({size})"
        )
        objective = (
            "Trained with token-level cross-entropy on the target given the source (teacher forcing); the decoder "
            "reads the labels shifted right behind `decoder_start_token_id`."
        )
    else:
        shape = (f"Decoder-only stack of {config['decoder_layers']} layers ({norm}-norm), width {config['d_model']}, "
                 f"{config['decoder_attention_heads']} attention heads ({size})")
        objective = "Trained with next-token cross-entropy."
    words = ATTENTION_WORDS[config["attention_type"]].format(h=config["rpe_horizon"])
    if config.get("feature_map", "elu") == "relu":
        relu = words.replace("elu(x) + 1", "max(x, 0)")
        words = relu if relu != words else words + ", with phi(x) = max(x, 0)"
    attention = "Attention is " + words
    decoder_attention = config.get("decoder_attention") if config["is_encoder_decoder"] else None
    if decoder_attention == "joint" or (decoder_attention == "count" and not variant.normalised):
        attention += ("; each decoder layer reads its own tokens and the encoder's with one set of queries, the two "
                      "sums added before one output norm, gate and projection")
        if decoder_attention == "count":
            attention += (", and the first reads the source tokens themselves in place of the encoder's output, with "
                          "the written tokens' projections and the values negated: it sums what remains to be written")
    elif decoder_attention == "count":
        attention += ("; the first decoder layer instead reads its own tokens and the source tokens themselves (not "
                      "the encoder's output) with one set of queries, unnormalised kernelized sums with phi(x) = "
                      "max(x, 0) and almost no decay, the source's values negated: it sums what remains to be written")
    elif decoder_attention == "count_block":
        heads, width = config.get("count_block_heads"), config.get("count_block_head_dim")
        attention += ("; the first decoder layer also has a count block before its self-attention"
                      + (f" in {heads} heads" if heads else "") + (f" of {width} channels" if width else "")
                      + ": one set of "
                      "queries on its own tokens and on the source tokens themselves (not the encoder's output)"
                      + (", both read through a token embedding table of its own"
                         if config.get("count_block_embeddings") else "")
                      + (f" of {config['count_block_embedding_dim']} channels per token, mapped to the model width"
                         if config.get("count_block_embeddings") and config.get("count_block_embedding_dim") else "")
                      + (", read without passing gradients back to them" if config.get("count_block_detach") else "")
                      + (", unnormalised kernelized sums with phi(x) = max(x, 0) and no decay" if variant.normalised
                         else "") + ", the source's values negated: it sums what remains to be written"
                      + (f", its output multiplied by a learned scale per channel started at "
                         f"{config['count_block_layer_scale']}" if config.get("count_block_layer_scale") else ""))
    if config["is_encoder_decoder"] and config.get("remaining_count_max"):
        attention += ("; each written token's embedding also gets a learned vector for how many more times the token "
                      "occurs in the source than it has been written, counted exactly per token id and clamped to "
                      f"[-1, {config['remaining_count_max']}]")
    attention += f"; it costs time {'quadratic' if variant.softmax else 'linear'} in the sequence length, and "
    attention += ("generation keeps a state of constant size instead of a growing key/value cache"
                  if variant.constant_state else "generation keeps a key/value cache")
    if config["absolute_positions"]:
        attention += f". {config['absolute_positions'].capitalize()} absolute positions are added to the embeddings"
    elif not sees_relative_positions(variant):
        attention += ". There are no absolute position embeddings either: the model has no position information"
    else:
        attention += ". There are no absolute position embeddings"
    tied = " Input embeddings and output projection are shared." if config["tie_word_embeddings"] else ""
    return f"{shape}. {attention}.{tied} {objective}"


def architecture_limitations(config: Mapping) -> list[str]:
    """What the attention, the positions and the training set-up imply for every model of this kind."""
    name, horizon = config["attention_type"], config["rpe_horizon"]
    variant = get_attention_variant(name)
    if variant.softmax:
        items = [f"`attention_type={name!r}` is softmax attention: its time and memory grow quadratically with the "
                 "input length, and so does its key/value cache during generation."]
    elif name == "local_softmax_decay":
        items = [f"The softmax decides only among the keys within {horizon} positions; farther keys enter through "
                 "kernelized weights phi(q).phi(k) / d that fade with distance, which cannot single out one distant key, "
                 "and the weights of softmax-attention models do not carry over."]
    else:
        weight = "phi(q).phi(k) over its row sum" if variant.normalised else "phi(q).phi(k), summed without a row sum"
        items = [f"Kernelized attention is not softmax attention: a weight is {weight}, with no exponential, so sharply "
                 "focused (near one-hot) attention is harder to express, and the weights of softmax-attention models "
                 "do not carry over."]
    if clips_positions(variant):
        beyond = (" except through the absolute positions added to the embeddings" if config["absolute_positions"]
                  else "")
        fade = (", and their weights fade geometrically with distance at a learned rate per head"
                if "decay" in variant.parameters(1, 1, 1, False) else "")
        items.append(f"Relative positions are clipped at a horizon of {horizon} tokens: keys farther away than that "
                     f"share one relative embedding{fade}, so one attention layer cannot tell positions beyond the "
                     f"horizon apart{beyond}.")
    elif sees_relative_positions(variant) and not config["absolute_positions"]:
        items.append("Positions enter only through the decay of the weights with distance, at a learned rate per "
                     "head: there is no relative-position table, so the order of two keys at similar distances "
                     "is hard to tell apart.")
    elif not sees_relative_positions(variant) and not config["absolute_positions"]:
        items.append(f"This model uses no position information (`attention_type={name!r}` without absolute "
                     "positions): its encoder sees the input as a bag of tokens.")
    reads_ids = []  # what makes the decoder read token ids rather than embeddings
    if config["is_encoder_decoder"] and config.get("decoder_attention") == "count_block" and config.get(
            "count_block_embeddings"):
        reads_ids.append("the count block embeds token ids with a table of its own")
    if config["is_encoder_decoder"] and config.get("remaining_count_max"):
        reads_ids.append("the decoder counts token ids in the source and in what it has written")
    if reads_ids:
        reasons = " and ".join(reads_ids)
        items.append(f"{reasons[0].upper()}{reasons[1:]}: the model takes `input_ids` and `decoder_input_ids`, not "
                     "`inputs_embeds`.")
    return items + [
        "Small model trained on a small CPU budget on a small corpus: the scores below are those of a demonstration, "
        "far below production translation or summarisation systems, and the outputs are often wrong.",
        "transformers 5 removed the `translation`, `summarization` and `text2text-generation` pipelines; use the "
        "tokenizer and `generate()` as shown below.",
        "Loading runs the modeling code stored in the repository (`trust_remote_code=True`); read it first.",
    ]


def _metric_base(name: str) -> str:
    prefix = next((p for p in SPLIT_PREFIXES if name.startswith(p) and name not in METRICS), "")
    return name[len(prefix):]


def get_started_code(model_id: str, config: Mapping, example_input: str) -> str:
    auto_class = "AutoModelForSeq2SeqLM" if config["is_encoder_decoder"] else "AutoModelForCausalLM"
    return (
        f"from transformers import {auto_class}, AutoTokenizer\n\n"
        f'tokenizer = AutoTokenizer.from_pretrained("{model_id}", trust_remote_code=True)\n'
        f'model = {auto_class}.from_pretrained("{model_id}", trust_remote_code=True)\n'
        f"inputs = tokenizer([{json.dumps(example_input, ensure_ascii=False)}], return_tensors=\"pt\")\n"
        "outputs = model.generate(**inputs, max_new_tokens=64)\n"
        "print(tokenizer.batch_decode(outputs, skip_special_tokens=True)[0])"
    )


def write_model_card(model_dir: str | os.PathLike, run: TrainingRun, *, model_id: str | None = None) -> Path:
    """Render the card of a folder written by ``save_pretrained`` and write it as ``<model_dir>/README.md``.

    ``model_id``, the repository id of the title and the loading code, defaults to the folder's name. Raises
    ``ValueError`` when the folder has no ``config.json`` or no safetensors weights.
    """
    root = Path(model_dir)
    if not (root / "config.json").is_file():
        raise ValueError(f"`model_dir` {str(root)!r} holds no config.json")
    model_id = model_id or root.resolve().name
    tensors = _tensor_shapes_and_dtypes(root)
    config = json.loads((root / "config.json").read_text(encoding="utf-8"))
    n_parameters = sum(math.prod(shape) for shape, _ in tensors)
    variant = get_attention_variant(config["attention_type"])
    kind = "encoder-decoder" if config["is_encoder_decoder"] else "decoder-only"
    family_tags = ["softmax-attention"] if variant.softmax else ["kernelized-attention", "linear-attention"]
    metric_bases = [_metric_base(name) for name in run.metrics]
    card_data = ModelCardData(
        license="apache-2.0",
        library_name="transformers",
        tags=list(dict.fromkeys(["scaleformer", "custom_code", *family_tags, kind, *run.tags])),
        pipeline_tag=run.pipeline_tag,
        metrics=list(dict.fromkeys(METRICS[b][0] for b in metric_bases if b in METRICS and METRICS[b][0])) or None,
        language=run.language or None,
        base_model=None if run.base_model is None or Path(run.base_model).exists() else run.base_model,
    )
    card = ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATE_PATH),
        run=run,
        model_id=model_id,
        kind=kind,
        task=PIPELINE_TASKS[run.pipeline_tag],
        attention="softmax" if variant.softmax else "kernelized",
        size_phrase=parameter_phrase(n_parameters),
        limitations=architecture_limitations(config) + run.limitations,
        sizes={
            "parameters": f"{n_parameters:,} ({n_parameters / 1e6:.2f} M)",
            "weights": f"{sum(p.stat().st_size for p in weight_files(root)) / 2**20:.1f} MiB (safetensors)",
            **run.speeds,
        },
        get_started_code=get_started_code(model_id, config, run.example_input),
        metric_descriptions={b: METRICS[b][1] for b in metric_bases if b in METRICS},
        columns=["this model", *run.baselines],
        rows=[
            [name, format_metric_value(value)]
            + [format_metric_value(b[name]) if name in b else "-" for b in run.baselines.values()]
            for name, value in run.metrics.items()
        ],
        architecture_paragraph=architecture_paragraph(config, n_parameters),
        architecture={
            **{name: config[name] for name in ARCHITECTURE_FIELDS if name in config},
            "attention score": variant.description,
            "parameters": f"{n_parameters:,}",
            "weights dtype": ", ".join(sorted({dtype for _, dtype in tensors})),
        },
        software=(
            f"transformers {transformers.__version__}, torch {torch.__version__}, huggingface_hub "
            f"{huggingface_hub.__version__}; modeling code: "
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
    """Upload ``<model_dir>/README.md`` to the Hub repository ``repo_id`` (which must exist: push the model first),
    through transformers' shared ``HfApi``; ``token`` and ``revision`` as for ``push_to_hub``."""
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

    def read_results(path: str) -> dict[str, float | int]:
        return results_for_card(json.loads(Path(path).read_text(encoding="utf-8")))

    run = TrainingRun(
        training_command=args.training_command,
        metrics=read_results(args.metrics_file),
        dataset_description=args.dataset_description,
        baselines={args.baseline_name: read_results(args.baseline_file)} if args.baseline_file else {},
        pipeline_tag=args.pipeline_tag,
        language=args.language,
        hardware=args.hardware,
        limitations=args.limitation,
        tags=args.tag,
    )
    path = write_model_card(args.model_dir, run, model_id=args.model_id)
    print(path)
    return path


if __name__ == "__main__":
    main()
