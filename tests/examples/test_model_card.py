"""Tests of ``model_cards/write_model_card.py`` and of pushing a card with the model, offline.

The Hub is replaced by a local folder (HF_NOTES §5): ``transformers.utils.hub.hf_api`` returns the ``fake_hub``
of ``conftest.py``, whose ``create_commit`` copies each file to ``<hub>/<repo_id>/<path_in_repo>``, and
``ModelCard.load`` reads a card from there, raising ``EntryNotFoundError`` while the repository has none, as the
Hub does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest
import torch
import transformers.utils.hub
from huggingface_hub import ModelCard
from huggingface_hub.errors import EntryNotFoundError
from transformers import AutoTokenizer

from modeling_scaleformer import ScaleformerConfig, ScaleformerForConditionalGeneration
from modeling_scaleformer.ops_registry import ATTENTION_VARIANTS

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = ROOT / "examples" / "tokenizer"
REPO_ID = "tester/scaleformer-tiny-card"
METRICS = {"eval_bleu": 1.2345, "eval_chrf": 17.891, "eval_loss": 7.5, "eval_samples": 16}
SOURCES = ["In the beginning God created the heaven and the earth.", "And God said, Let there be light."]
# BART's decoder layers, the count block's fields off and no remaining counts: the start of the card cases that
# describe one decoder option at a time
BART_DECODER = dict(decoder_attention="separate", count_block_heads=None, count_block_head_dim=None,
                    count_block_embeddings=False, count_block_embedding_dim=None, count_block_layer_scale=None,
                    remaining_count_max=None)


def tiny_model() -> tuple[ScaleformerForConditionalGeneration, object]:
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    config = ScaleformerConfig(
        vocab_size=len(tokenizer), d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, rpe_horizon=4,
    )
    torch.manual_seed(0)
    return ScaleformerForConditionalGeneration(config).eval(), tokenizer


def write_card(card_module, folder: Path, **facts) -> Path:
    run = card_module.TrainingRun(
        training_command="python examples/run_seq2seq.py --config_name tiny.json --max_steps 4",
        metrics=METRICS,
        dataset_description="64 English -> Spanish Bible verses from examples/data/bible.",
        **facts,
    )
    return card_module.write_model_card(folder, run)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ScaleformerForConditionalGeneration, object]:
    model, tokenizer = tiny_model()
    folder = tmp_path_factory.mktemp("saved") / "tiny"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model, tokenizer


@pytest.mark.parametrize(
    "changes, present, absent",
    [
        pytest.param(None, ["(post-norm)", "softmax attention over the nearest keys, with relative keys clipped to "
                            "[-16, 16]", "linear in the sequence length",
                            "no absolute position embeddings", "The softmax decides only among the keys within 16",
                            "clipped at a horizon of 16", "fade geometrically",
                            "the first decoder layer also has a count block before its self-attention in 64 heads of 2 "
                            "channels", "a token embedding table of its own of 32 channels per token",
                            "started at 0.1", "clamped to [-1, 3]", "The count block embeds token ids with a table of "
                            "its own and the decoder counts token ids in the source and in what it has written: the "
                            "model takes `input_ids` and `decoder_input_ids`, not `inputs_embeds`"],
                     ["quadratic", "except through", "not softmax attention"], id="default"),
        pytest.param({}, ["(post-norm)", "softmax attention over the nearest keys"],
                     ["count block", "inputs_embeds", "remaining"], id="default-attention-bart-decoder"),
        pytest.param({"attention_type": "kernelized_rpe", "layer_norm_position": "pre"},
                     ["(pre-norm)", "clipped to [-16, 16]", "linear in the sequence length",
                      "no absolute position embeddings", "not softmax attention", "clipped at a horizon of 16"],
                     ["quadratic", "except through", "fade"], id="kernelized_rpe-pre-norm"),
        pytest.param({"layer_norm_position": "post", "absolute_positions": "sinusoidal"},
                     ["(post-norm)", "Sinusoidal absolute positions are added", "linear in the sequence length",
                      "beyond the horizon apart except through the absolute positions"],
                     ["no absolute", "(pre-norm)"], id="post-norm-sinusoidal"),
        pytest.param({"attention_type": "softmax"},
                     ["softmax attention with no relative-position term", "quadratic", "no position information",
                      "bag of tokens", "`attention_type='softmax'` is softmax attention"],
                     ["kernelized", "linear in the sequence", "clipped"], id="softmax"),
        pytest.param({"attention_type": "kernelized_decay_gated", "feature_map": "relu", "decoder_attention": "joint"},
                     ["summed without a row normaliser", "with phi(x) = max(x, 0)", "reads its own tokens and the "
                      "encoder's with one set of queries"], ["elu", "source tokens themselves"], id="joint-relu"),
        pytest.param({"attention_type": "kernelized_decay_gated", "feature_map": "relu", "decoder_attention": "count"},
                     ["one set of queries", "the first reads the source tokens themselves"], ["elu"], id="count"),
        pytest.param({"decoder_attention": "count"},
                     ["the first decoder layer instead reads its own tokens and the source tokens themselves",
                      "softmax attention over the nearest keys"], ["each decoder layer reads"], id="count-default-type"),
        pytest.param({"decoder_attention": "count_block"},
                     ["the first decoder layer also has a count block before its self-attention",
                      "phi(x) = max(x, 0) and no decay"], ["each decoder layer reads", "the first decoder layer instead",
                      "almost no decay"], id="count-block"),
        pytest.param({"decoder_attention": "count_block", "count_block_heads": 64},
                     ["the first decoder layer also has a count block before its self-attention in 64 heads: one set"],
                     ["a token embedding table of its own", "inputs_embeds", "learned scale"],
                     id="count-block-64-heads"),
        pytest.param({"decoder_attention": "count_block", "count_block_heads": 64, "count_block_head_dim": 2},
                     ["the first decoder layer also has a count block before its self-attention in 64 heads of 2 "
                      "channels: one set"], [], id="count-block-64-heads-of-2"),
        pytest.param({"decoder_attention": "count_block", "count_block_detach": True},
                     ["the source tokens themselves (not the encoder's output), read without passing gradients back"],
                     [], id="count-block-detach"),
        pytest.param({"decoder_attention": "count_block", "count_block_embeddings": True},
                     ["(not the encoder's output), both read through a token embedding table of its own",
                      "the model takes `input_ids` and `decoder_input_ids`, not `inputs_embeds`"], [],
                     id="count-block-own-embeddings"),
        pytest.param({"decoder_attention": "count_block", "count_block_embeddings": True,
                      "count_block_embedding_dim": 16},
                     ["both read through a token embedding table of its own of 16 channels per token, mapped to the "
                      "model width", "not `inputs_embeds`"], [], id="count-block-narrow-own-embeddings"),
        pytest.param({"decoder_attention": "count_block", "count_block_layer_scale": 0.1},
                     ["it sums what remains to be written, its output multiplied by a learned scale per channel "
                      "started at 0.1"], [], id="count-block-layer-scale"),
        pytest.param({"remaining_count_max": 3},
                     ["each written token's embedding also gets a learned vector for how many more times the token "
                      "occurs in the source than it has been written, counted exactly per token id and clamped to "
                      "[-1, 3]", "the model takes `input_ids` and `decoder_input_ids`, not `inputs_embeds`"],
                     ["count block"], id="remaining-counts"),
        pytest.param({"attention_type": "kernelized_gated", "feature_map": "relu"},
                     ["decay of the weights with distance and no relative-position table", "with phi(x) = max(x, 0)",
                      "Positions enter only through the decay"], ["clipped", "bag of tokens"], id="kernelized_gated"),
        pytest.param({"attention_type": "kernelized_sum", "feature_map": "relu"},
                     ["no decay and no position information", "with phi(x) = max(x, 0)", "bag of tokens",
                      "summed without a row sum"], ["clipped", "over its row sum", "elu"], id="kernelized_sum"),
        pytest.param({"attention_type": "kernelized_decay", "feature_map": "relu"},
                     ["phi(k) with phi(x) = max(x, 0), normalised"], ["elu", "one set of queries"], id="relu"),
        pytest.param({"attention_type": "toeplitz", "rpe_horizon": 8},
                     ["exp(b), offsets clipped to [-8, 8], by FFT", "linear in the sequence length",
                      "clipped at a horizon of 8"], ["quadratic"], id="toeplitz"),
    ],
)
def test_card_describes_the_configured_attention_norm_and_positions(card_module, changes, present, absent):
    """`changes` None: the default configuration; otherwise the default with BART's decoder layers and no counts
    (`BART_DECODER`), then `changes`."""
    config = {**ScaleformerConfig().to_dict(), **({} if changes is None else {**BART_DECODER, **changes})}
    text = (card_module.architecture_paragraph(config, 1_000_000) + " "
            + " ".join(card_module.architecture_limitations(config)))
    for phrase in present:
        assert phrase in text, phrase
    for phrase in absent:
        assert phrase not in text, phrase


@pytest.mark.parametrize("n, phrase", [(7_612_345, "A 7.61 M-parameter"), (8_086_054, "An 8.09 M-parameter"),
                                       (11_200_000, "An 11.20 M-parameter"), (18_000_000, "An 18.00 M-parameter"),
                                       (49_147_026, "A 49.15 M-parameter"), (85_000_000, "An 85.00 M-parameter"),
                                       (110_000_000, "A 110.00 M-parameter")])
def test_card_names_the_size_with_its_article(card_module, n, phrase):
    assert card_module.parameter_phrase(n) == phrase


@pytest.mark.parametrize("name", sorted(ATTENTION_VARIANTS))
def test_card_states_the_registry_facts_of_every_attention_type(card_module, name):
    variant = ATTENTION_VARIANTS[name]
    config = {**ScaleformerConfig().to_dict(), "attention_type": name, "rpe_horizon": 5}
    paragraph = card_module.architecture_paragraph(config, 1_000_000)
    limitations = " ".join(card_module.architecture_limitations(config))
    assert ("quadratic in the sequence length" in paragraph) == variant.softmax
    assert ("linear in the sequence length" in paragraph) == (not variant.softmax)
    assert ("a state of constant size" in paragraph) == variant.constant_state
    # a table of relative offsets [-h, h] has 2h + 1 rows
    clipped = any(11 in spec.shape for spec in variant.parameters(3, 8, 5, False).values())
    assert ("clipped to [-5, 5]" in paragraph) == clipped
    assert ("clipped at a horizon of 5 tokens" in limitations) == clipped
    assert ("bag of tokens" in limitations) == (not variant.parameters(3, 8, 5, False))


def test_card_sections_and_parameter_count(card_module, saved):
    folder, model, _ = saved
    path = write_card(
        card_module, folder, baselines={"copy the source": {"eval_bleu": 0.5, "eval_chrf": 16.0}},
        limitations=["Only 64 verses were seen."], pipeline_tag="translation", language=["en", "es"],
        hardware="CPU, 2 cores",
    )
    text = path.read_text(encoding="utf-8")
    assert path == folder / "README.md"

    n_parameters = sum(p.numel() for p in model.parameters())  # shared embeddings counted once
    assert card_module.count_parameters(folder) == n_parameters == model.num_parameters()
    assert f"| parameters | {n_parameters:,} |" in text

    for heading in ("# Model Card for tiny", "## Model Details", "## Uses", "## Bias, Risks, and Limitations",
                    "## How to Get Started with the Model", "### Training Data", "#### Training Command",
                    "#### Training Hyperparameters", "#### Speeds, Sizes, Times", "## Evaluation", "### Results",
                    "### Model Architecture and Objective", "#### Hardware", "#### Software"):
        assert f"\n{heading}\n" in f"\n{text}", heading
    assert "more information needed" not in text.lower()
    assert "python examples/run_seq2seq.py --config_name tiny.json --max_steps 4" in text
    assert "| eval_bleu | 1.234 | 0.5000 |" in text and "| eval_chrf | 17.89 | 16.00 |" in text
    assert "| eval_samples | 16 | - |" in text
    assert "| rpe_horizon | 4 |" in text and "| attention_type | local_softmax_decay |" in text
    assert "clipped at a horizon of 4 tokens" in text and "The softmax decides only among the keys within 4" in text
    assert "- Only 64 verses were seen." in text
    assert 'AutoTokenizer.from_pretrained("tiny", trust_remote_code=True)' in text
    assert 'AutoModelForSeq2SeqLM.from_pretrained("tiny", trust_remote_code=True)' in text

    data = ModelCard.load(path).data
    assert (data.license, data.library_name, data.pipeline_tag) == ("apache-2.0", "transformers", "translation")
    assert {"scaleformer", "kernelized-attention", "custom_code"} <= set(data.tags)
    assert data.language == ["en", "es"]


def test_card_leaves_out_sections_without_data(card_module, saved, tmp_path):
    folder, _, _ = saved
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    text = write_card(card_module, copy).read_text(encoding="utf-8")
    for heading in ("#### Preprocessing", "#### Hardware", "## Citation", "#### Summary", "- **Language(s)",
                    "- **Finetuned from"):
        assert heading not in text
    assert "more information needed" not in text.lower()
    assert "| metric | this model |\n|---|---:|\n" in text


def test_base_model_is_metadata_only_for_hub_ids(card_module, saved, tmp_path):
    folder, _, _ = saved
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    local = ModelCard.load(write_card(card_module, copy, base_model=str(folder)))
    assert local.data.base_model is None and f"- **Finetuned from model:** {folder}" in local.text
    hub = ModelCard.load(write_card(card_module, copy, base_model="someone/scaleformer-base"))
    assert hub.data.base_model == "someone/scaleformer-base"
    assert "- **Finetuned from model:** someone/scaleformer-base" in hub.text


def test_card_arguments_are_checked(card_module, saved, tmp_path):
    folder, _, _ = saved
    run = card_module.TrainingRun
    with pytest.raises(ValueError, match="config.json"):
        write_card(card_module, tmp_path)
    with pytest.raises(ValueError, match="`metrics`"):
        card_module.write_model_card(folder, run(training_command="x", metrics={}, dataset_description="d"))
    with pytest.raises(ValueError, match="`metrics`"):
        card_module.write_model_card(folder, run(training_command="x", metrics={"bleu": "high"},
                                                 dataset_description="d"))
    with pytest.raises(ValueError, match="`pipeline_tag`"):
        write_card(card_module, folder, pipeline_tag="translate")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="model.safetensors"):
        write_card(card_module, tmp_path)


def test_format_metric_value(card_module):
    fmt = card_module.format_metric_value
    assert [fmt(35.4321), fmt(0.00123), fmt(12345.6), fmt(0.0), fmt(7), fmt(100.0)] == [
        "35.43", "0.001230", "12346", "0", "7", "100.0"
    ]
    with pytest.raises(ValueError, match="`value`"):
        fmt("1.0")


def test_command_line(card_module, saved, tmp_path):
    folder, _, _ = saved
    copy = tmp_path / "cli"
    shutil.copytree(folder, copy)
    metrics_file = tmp_path / "all_results.json"
    metrics_file.write_text(json.dumps({"eval_chrf": 12.5, "eval_runtime": 3.2, "epoch": 1.0}))
    path = card_module.main([str(copy), "--training_command", "python train.py", "--metrics_file",
                             str(metrics_file), "--dataset_description", "verses", "--model_id", "me/tiny"])
    text = path.read_text(encoding="utf-8")
    assert "| eval_chrf | 12.50 |" in text and "eval_runtime" not in text
    assert "# Model Card for me/tiny" in text


CHILD = textwrap.dedent(
    """
    import sys
    sys.modules["modeling_scaleformer"] = None  # the package must not be importable here
    import json
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    folder, sources = sys.argv[1], json.loads(sys.argv[2])
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    inputs = tokenizer(sources, return_tensors="pt", padding=True)
    tokens = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    logits = model(**inputs, decoder_input_ids=tokens[:, :4]).logits[:, :, :8]
    print(json.dumps({"module": type(model).__module__, "tokens": tokens.tolist(), "logits": logits.tolist()}))
    """
)


def test_push_to_hub_round_trip_with_card(card_module, fake_hub, tmp_path):
    model, tokenizer = tiny_model()
    folder = tmp_path / "trained"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_card(card_module, folder, pipeline_tag="translation")

    hub = fake_hub
    pushed = tmp_path / "hub" / REPO_ID
    original_load = ModelCard.load

    def load_card(repo_id_or_path, *args, **kwargs):
        card = pushed / "README.md"
        if Path(repo_id_or_path).is_file():
            return original_load(repo_id_or_path, *args, **kwargs)
        if repo_id_or_path == REPO_ID and card.is_file():
            return original_load(card)
        raise EntryNotFoundError(f"{repo_id_or_path} has no README.md")

    # transformers.utils.hub imports ModelCard from huggingface_hub: the class attribute is what it calls
    assert transformers.utils.hub.ModelCard is ModelCard
    with mock.patch.object(transformers.utils.hub, "hf_api", lambda: hub), \
            mock.patch.object(transformers.utils.hub.ModelCard, "load", load_card):
        model.push_to_hub(REPO_ID)
        tokenizer.push_to_hub(REPO_ID)
        generic = (pushed / "README.md").read_text(encoding="utf-8")
        card_module.push_model_card(folder, REPO_ID)
        # a later push of the model starts from the card now in the repository and keeps it
        model.push_to_hub(REPO_ID)

    assert "this model card has been automatically generated" in generic.lower()
    card = (pushed / "README.md").read_text(encoding="utf-8")
    assert "more information needed" not in card.lower()
    assert "| eval_bleu | 1.234 |" in card and "| eval_chrf | 17.89 |" in card
    assert "trust_remote_code=True" in card
    assert hub.commits[2] == ["README.md"]
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                 "configuration_scaleformer.py", "modeling_scaleformer.py"):
        assert (pushed / name).is_file(), name

    inputs = tokenizer(SOURCES, return_tensors="pt", padding=True)
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=12, do_sample=False)
        logits = model(**inputs, decoder_input_ids=expected[:, :4]).logits[:, :, :8]
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "HF_"))}
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    child = subprocess.run(
        [sys.executable, "-I", "-c", CHILD, str(pushed), json.dumps(SOURCES)],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert "Do you wish to run the custom code" not in child.stdout
    result = json.loads(child.stdout)
    assert result["module"].startswith("transformers_modules.")
    assert result["tokens"] == expected.tolist()
    torch.testing.assert_close(torch.tensor(result["logits"]), logits, rtol=1e-5, atol=1e-5)
