"""ScaleformerForSequenceClassification: masked-mean pooling, losses, padding, save/load, remote code, training."""

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForSequenceClassification

from modeling_scaleformer import ScaleformerConfig, ScaleformerForSequenceClassification


SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "listops.py"


def load_listops():
    """Import ``benchmarks/listops.py`` (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location("benchmarks_listops", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


listops = load_listops()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # the tensors here are tiny: on a busy 2-core machine intra-op threads cost far more than they save
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_config(**overrides) -> ScaleformerConfig:
    kwargs = dict(
        vocab_size=len(listops.LISTOPS_VOCAB), d_model=16, encoder_layers=2, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        rpe_horizon=3, dropout=0.0, init_std=0.1, num_labels=10,
    )
    kwargs.update(overrides)
    return ScaleformerConfig(**kwargs)


def model_for(seed: int = 0, dtype=torch.float64, **overrides) -> ScaleformerForSequenceClassification:
    torch.manual_seed(seed)
    return ScaleformerForSequenceClassification(tiny_config(**overrides)).to(dtype).eval()


def random_ids(b: int, length: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, len(listops.LISTOPS_VOCAB), (b, length), generator=g)


def pad_batch(rows: list[torch.Tensor], side: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad to the longest row with random non-pad ids, so that only the mask can hide them."""
    width = max(len(r) for r in rows)
    ids = random_ids(len(rows), width, seed=seed + 100)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if side == "left" else slice(0, len(row))
        ids[i, span], mask[i, span] = row, 1
    return ids, mask


def test_forward_shapes_and_tuple_output():
    model = model_for()
    ids = random_ids(3, 7)
    out = model(input_ids=ids, labels=torch.tensor([1, 2, 3]), output_hidden_states=True)
    assert out.logits.shape == (3, 10) and out.loss.shape == ()
    assert len(out.hidden_states) == 3 and all(h.shape == (3, 7, 16) for h in out.hidden_states)
    loss, logits = model(input_ids=ids, labels=torch.tensor([1, 2, 3]), return_dict=False)[:2]
    torch.testing.assert_close(logits, out.logits)
    torch.testing.assert_close(loss, out.loss)
    pooled = out.hidden_states[-1].mean(dim=1)
    torch.testing.assert_close(out.logits, model.classifier(pooled))


def test_single_label_loss_matches_manual_cross_entropy():
    model = model_for()
    ids, mask = pad_batch([random_ids(1, n, seed=n)[0] for n in (9, 5, 2, 7)], "right")
    labels = torch.tensor([3, 0, 9, -100])
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    assert out.logits.dtype == torch.float64 and out.loss.dtype == torch.float64
    manual = -torch.log_softmax(out.logits, dim=-1)[torch.arange(3), labels[:3]].mean()
    torch.testing.assert_close(out.loss, manual)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels))
    summed = model(input_ids=ids, attention_mask=mask, labels=labels, num_items_in_batch=torch.tensor(8)).loss
    torch.testing.assert_close(summed, manual * 3 / 8)
    assert model.config.problem_type is None


def test_regression_and_multi_label_losses():
    ids = random_ids(3, 6)
    regression = model_for(num_labels=1)
    targets = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    out = regression(input_ids=ids, labels=targets)
    assert out.logits.shape == (3, 1)
    torch.testing.assert_close(out.loss, ((out.logits[:, 0] - targets) ** 2).mean())
    torch.testing.assert_close(regression(input_ids=ids, labels=targets[:, None]).loss, out.loss)

    multi_hot = torch.tensor([[1.0] * 5 + [0.0] * 5, [0.0] * 10, [0.0, 1.0] * 5], dtype=torch.float64)
    for model in (model_for(), model_for(problem_type="multi_label_classification")):
        out = model(input_ids=ids, labels=multi_hot)
        p = torch.sigmoid(out.logits)
        manual = -(multi_hot * torch.log(p) + (1 - multi_hot) * torch.log1p(-p)).mean()
        torch.testing.assert_close(out.loss, manual)


@pytest.mark.parametrize(
    "overrides, labels",
    [
        pytest.param(dict(), torch.tensor([0, 10, 1]), id="class-too-large"),
        pytest.param(dict(), torch.tensor([0, -5, 1]), id="negative-class"),
        pytest.param(dict(), torch.tensor([0, 1]), id="batch-mismatch"),
        pytest.param(dict(), torch.tensor([[0], [1], [2]]), id="class-ids-2d"),
        pytest.param(dict(problem_type="single_label_classification"), torch.tensor([0.0, 1.0, 2.0]), id="float-ids"),
        pytest.param(dict(), torch.ones(3, 9), id="multi-hot-width"),
        pytest.param(dict(), torch.full((3, 10), 2.0), id="multi-hot-range"),
        pytest.param(dict(num_labels=1), torch.ones(3, 2), id="regression-shape"),
    ],
)
def test_bad_labels_raise(overrides, labels):
    model = model_for(dtype=torch.float32, **overrides)
    with pytest.raises(ValueError, match="`labels`"):
        model(input_ids=random_ids(3, 5), labels=labels)


ATTENTION_TYPES = [
    pytest.param(dict(), id="default"),
    pytest.param(dict(attention_type="kernelized"), id="kernelized"),
    pytest.param(dict(attention_mode="linear"), id="kernelized_rpe-linear"),
    pytest.param(dict(attention_type="fourier"), id="fourier"),
    pytest.param(dict(attention_type="toeplitz"), id="toeplitz"),
    pytest.param(dict(attention_type="xl_relative"), id="xl_relative"),
    pytest.param(dict(attention_type="shaw_softmax"), id="shaw_softmax"),
    pytest.param(dict(attention_type="softmax"), id="softmax"),
]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("overrides", ATTENTION_TYPES)
def test_padding_invariance(overrides, side):
    model = model_for(**overrides)
    rows = [random_ids(1, n, seed=n)[0] for n in (9, 5, 1, 8)]
    ids, mask = pad_batch(rows, side)
    batched = model(input_ids=ids, attention_mask=mask).logits
    for i, row in enumerate(rows):
        alone = model(input_ids=row[None]).logits[0]
        torch.testing.assert_close(batched[i], alone)


def test_fully_masked_row_raises():
    model = model_for()
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]])
    with pytest.raises(ValueError, match="`attention_mask`.*row 1"):
        model(input_ids=random_ids(2, 3), attention_mask=mask)


@pytest.mark.parametrize("overrides", [{}, dict(decoder_attention="count_block", count_block_embeddings=True)],
                         ids=["default", "count-block-own-table"])
def test_inputs_embeds_equal_input_ids(overrides):
    """The classifier has no decoder: a config whose count block embeds ids takes embeddings all the same."""
    model = model_for(**overrides)
    ids, mask = pad_batch([random_ids(1, n, seed=n)[0] for n in (6, 3)], "right")
    from_ids = model(input_ids=ids, attention_mask=mask).logits
    from_embeds = model(inputs_embeds=model.get_input_embeddings()(ids), attention_mask=mask).logits
    torch.testing.assert_close(from_embeds, from_ids)
    with pytest.raises(ValueError, match="exactly one"):
        model(input_ids=ids, inputs_embeds=model.get_input_embeddings()(ids))
    with pytest.raises(ValueError, match="output_attentions"):
        model(input_ids=ids, output_attentions=True)


def test_decoder_only_config_uses_the_bidirectional_encoder_stack():
    encoder_decoder = model_for(encoder_layers=3, decoder_layers=1)
    config = tiny_config(encoder_layers=3, decoder_layers=4, is_encoder_decoder=False)
    decoder_only = ScaleformerForSequenceClassification(config).double().eval()
    assert len(decoder_only.model.encoder.layers) == 3 and not any("decoder" in n for n, _ in decoder_only.named_parameters())
    decoder_only.load_state_dict(encoder_decoder.state_dict())
    ids, mask = pad_batch([random_ids(1, n, seed=n)[0] for n in (6, 3)], "right")
    expected = encoder_decoder(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(decoder_only(input_ids=ids, attention_mask=mask).logits, expected)
    # bidirectional: the first position sees the last token
    changed = ids.clone()
    changed[0, 5] = 1 if ids[0, 5] != 1 else 2
    first = decoder_only(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, 0]
    assert not torch.allclose(first, decoder_only(input_ids=changed, output_hidden_states=True).hidden_states[-1][0, 0])
    with pytest.raises(ValueError, match="`encoder_layers`"):
        ScaleformerForSequenceClassification(tiny_config(encoder_layers=0, is_encoder_decoder=False))


def test_save_and_load_with_auto_class(tmp_path):
    model = model_for(dtype=torch.float32)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert type(loaded) is ScaleformerForSequenceClassification and loaded.config.num_labels == 10
    assert loaded.config.auto_map["AutoModelForSequenceClassification"].endswith("ScaleformerForSequenceClassification")
    for (n, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), n
    ids = random_ids(2, 6)
    torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


REMOTE = """
import sys, torch
# the machine may have the package installed (editable or not): make it unimportable here
sys.modules["modeling_scaleformer"] = None
try:
    import modeling_scaleformer
    raise SystemExit("the package is importable")
except ImportError:
    pass
from transformers import AutoModelForSequenceClassification
path, ref = sys.argv[1], sys.argv[2]
model = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
assert type(model).__name__ == "ScaleformerForSequenceClassification", type(model).__name__
expected = torch.load(ref)
ids = torch.tensor([[2, 8, 15, 3, 9, 10, 5, 5]])
mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]])
torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits, expected)
print("remote ok")
"""


def test_remote_code_load_without_package(tmp_path):
    model = model_for(dtype=torch.float32)
    folder = tmp_path / "scaleformer-listops"
    model.save_pretrained(folder)
    ids = torch.tensor([[2, 8, 15, 3, 9, 10, 5, 5]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]])
    torch.save(model(input_ids=ids, attention_mask=mask).logits.detach(), tmp_path / "ref.pt")
    script = tmp_path / "load.py"
    script.write_text(textwrap.dedent(REMOTE))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    # -I: isolated mode, neither PYTHONPATH nor the working directory is on sys.path
    result = subprocess.run(
        [sys.executable, "-I", str(script), str(folder), str(tmp_path / "ref.pt")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0 and "remote ok" in result.stdout, result.stderr[-3000:]


def test_training_steps_reduce_loss_on_listops():
    examples = listops.generate_listops(32, seed=0, min_length=4, max_length=24, max_depth=4, max_args=4)
    rows = [torch.tensor(listops.tokenize(e["source"])) for e in examples]
    ids, mask = pad_batch(rows, "right")
    ids = ids.masked_fill(mask == 0, listops.PAD_ID)
    labels = torch.tensor([e["target"] for e in examples])
    torch.manual_seed(0)
    model = ScaleformerForSequenceClassification(tiny_config(d_model=32, encoder_ffn_dim=64, dropout=0.1))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    with torch.no_grad():
        final = model(input_ids=ids, attention_mask=mask, labels=labels).loss.item()
    assert final < 0.6 * losses[0], (losses[0], final)
