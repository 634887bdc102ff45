"""Tests of ``examples/train_accelerate.py`` and of the launch configs in ``configs/accelerate/``.

The training runs are real subprocesses on a tiny model (d_model 32, one encoder and one decoder
layer, no dropout) and 64 Bible verse pairs: a 2-rank CPU run under ``accelerate launch`` with
``configs/accelerate/cpu_2proc.yaml``, one-process runs with the same global batch, and a resumed run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DistributedType
from safetensors.torch import load_file

import modeling_scaleformer.modeling_scaleformer as modeling

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_accelerate.py"
CONFIG_DIR = ROOT / "configs" / "accelerate"
BIBLE_DIR = ROOT / "examples" / "data" / "bible"

# Gradients of one global batch computed as 1 x 8, 2 ranks x 2 micro-batches x 2 and 1 x 2 x 4 differ
# only in the order of fp32 sums (padding to a different length, a gloo all-reduce, accumulation):
# rounding of about 1e-7 relative per operation. Measured max abs differences: 3e-8 (two ranks) and
# 1.5e-8 (accumulation), for gradients up to 0.22. A wrong normalisation is off by a factor of 2 or
# more (dropping the num_processes factor gives a relative difference of 0.5), a wrong batch by far more.
GRAD_TOLERANCE = {"rtol": 1e-4, "atol": 1e-6}
STEPS = 4


@pytest.fixture(scope="module")
def tiny_config(tiny_config_fields: dict) -> dict:
    return {**tiny_config_fields, "dropout": 0.0}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, tiny_config: dict, common: ModuleType) -> Path:
    """A tiny model config and a data folder with 64 training and 8 validation pairs in fields src/tgt."""
    root = tmp_path_factory.mktemp("accelerate")
    (root / "tiny.json").write_text(json.dumps(tiny_config))
    data = root / "data"
    data.mkdir()
    for split, count in (("train", 64), ("validation", 8)):
        records = common.read_jsonl(BIBLE_DIR / f"{split}.jsonl")[:count]
        common.write_jsonl([{"src": r["en"], "tgt": r["es"]} for r in records], data / f"{split}.jsonl")
    return root


def run_training(workdir: Path, output_dir: Path, *extra: str, launch_config: str | None = None) -> Path:
    """Run the script in a subprocess (under `accelerate launch` when `launch_config` is given)."""
    args = [
        str(SCRIPT), "--model_config", str(workdir / "tiny.json"), "--data_dir", str(workdir / "data"),
        "--source_field", "src", "--target_field", "tgt", "--output_dir", str(output_dir),
        "--learning_rate", "3e-3", "--warmup_steps", "0", "--logging_steps", "1", "--seed", "7",
        "--eval_steps", "0", *extra,
    ]
    if launch_config is None:
        command = [sys.executable, *args]
    else:
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                   str(CONFIG_DIR / launch_config), *args]
    result = subprocess.run(command, env=clean_env(workdir, use_cpu=launch_config is not None), cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise AssertionError(
            f"training failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
        )
    return output_dir


def clean_env(workdir: Path, use_cpu: bool) -> dict[str, str]:
    """The environment without launcher settings from outside: offline, CPU only, its own HF_HOME."""
    launcher_vars = {"WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_") and k not in launcher_vars}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(workdir / "hf_home"),
               TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="")
    if use_cpu:
        env["ACCELERATE_USE_CPU"] = "true"
    return env


def read_log(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "log_history.jsonl").read_text(encoding="utf-8").splitlines()]


def train_losses(output_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_log(output_dir) if "loss" in r}


@pytest.fixture(scope="module")
def reference_run(workdir: Path) -> Path:
    """One process, 8 examples per step, 4 steps, checkpoints at steps 2 and 4, evaluation at step 4."""
    return run_training(
        workdir, workdir / "reference", "--per_device_batch_size", "8", "--max_steps", str(STEPS),
        "--checkpointing_steps", "2", "--eval_steps", str(STEPS), "--eval_examples", "8",
        "--eval_max_new_tokens", "8", "--dump_gradients", str(workdir / "grads_reference.pt"),
    )


def assert_same_gradients(dump: dict, reference: dict, tiny_config: dict) -> None:
    assert dump["global_batch"] == reference["global_batch"]
    assert dump["num_items_in_batch"] == reference["num_items_in_batch"]
    model = modeling.ScaleformerForConditionalGeneration(
        modeling.ScaleformerConfig(**{k: v for k, v in tiny_config.items() if k != "model_type"})
    )
    # every parameter has a gradient in both
    assert set(dump["gradients"]) == set(reference["gradients"]) == {name for name, _ in model.named_parameters()}
    for name, grad in reference["gradients"].items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(dump["gradients"][name], grad, **GRAD_TOLERANCE, msg=lambda m: f"{name}: {m}")


def test_two_cpu_ranks_give_the_one_process_gradient(workdir: Path, reference_run: Path, tiny_config: dict) -> None:
    """2 ranks x 2 micro-batches x 2 examples under accelerate launch == 1 process x 8 examples."""
    out = run_training(
        workdir, workdir / "two_ranks", "--per_device_batch_size", "2", "--gradient_accumulation_steps", "2",
        "--max_steps", "2", "--eval_steps", "2", "--eval_examples", "8", "--eval_max_new_tokens", "8",
        "--dump_gradients", str(workdir / "grads_two_ranks.pt"), launch_config="cpu_2proc.yaml",
    )
    info = json.loads((out / "run_info.json").read_text())
    assert info["distributed_type"] == "MULTI_CPU"
    assert info["num_processes"] == 2 and info["global_batch_size"] == 8
    assert [r["process_index"] for r in info["ranks"]] == [0, 1]
    assert len({r["pid"] for r in info["ranks"]}) == 2

    dump = torch.load(workdir / "grads_two_ranks.pt")
    reference = torch.load(workdir / "grads_reference.pt")
    # each rank saw its own half of the global batch, two micro-batches of two examples
    assert [rank["process_index"] for rank in dump["per_rank"]] == [0, 1]
    seen = [i for rank in dump["per_rank"] for micro in rank["micro_batches"] for i in micro]
    assert [len(m) for rank in dump["per_rank"] for m in rank["micro_batches"]] == [2, 2, 2, 2]
    assert sorted(seen) == sorted(reference["global_batch"])
    assert_same_gradients(dump, reference, tiny_config)

    # same data order and same updates: the logged losses agree too
    ours, theirs = train_losses(out), train_losses(reference_run)
    for step in (1, 2):
        assert ours[step] == pytest.approx(theirs[step], rel=1e-5)
    evaluation = [r for r in read_log(out) if "eval_loss" in r]
    assert len(evaluation) == 1 and {"eval_chrf", "eval_bleu"} <= evaluation[0].keys()


def test_gradient_accumulation_gives_the_big_batch_gradient(workdir: Path, reference_run: Path,
                                                            tiny_config: dict) -> None:
    """1 process x 2 micro-batches x 4 examples == 1 process x 8 examples."""
    run_training(
        workdir, workdir / "accumulation", "--per_device_batch_size", "4", "--gradient_accumulation_steps", "2",
        "--max_steps", "1", "--dump_gradients", str(workdir / "grads_accumulation.pt"),
    )
    assert_same_gradients(torch.load(workdir / "grads_accumulation.pt"), torch.load(workdir / "grads_reference.pt"),
                          tiny_config)


def test_resume_continues_with_the_same_losses(workdir: Path, reference_run: Path) -> None:
    """Resuming from the step-2 checkpoint logs the uninterrupted run's losses at steps 3 and 4."""
    out = workdir / "resumed"
    shutil.copytree(reference_run / "checkpoints" / "step_2", out / "checkpoints" / "step_2")
    run_training(workdir, out, "--per_device_batch_size", "8", "--max_steps", str(STEPS),
                 "--resume_from_checkpoint", "latest")
    resumed, uninterrupted = train_losses(out), train_losses(reference_run)
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        assert abs(resumed[step] - uninterrupted[step]) <= 1e-6, (step, resumed[step], uninterrupted[step])
    # and the first step after the checkpoint is not a repeat of an earlier one
    assert abs(resumed[3] - uninterrupted[2]) > 1e-4
    final, reference = load_file(out / "model.safetensors"), load_file(reference_run / "model.safetensors")
    assert sorted(final) == sorted(reference)
    for name in reference:
        torch.testing.assert_close(final[name], reference[name], rtol=0, atol=1e-6)


def test_reference_run_saves_a_loadable_model_and_evaluates(reference_run: Path, tiny_config: dict) -> None:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    log = read_log(reference_run)
    assert [r["step"] for r in log if "loss" in r] == [1, 2, 3, 4]
    assert log[-1]["step"] == STEPS and {"eval_loss", "eval_chrf", "eval_bleu"} <= log[-1].keys()
    info = json.loads((reference_run / "run_info.json").read_text())
    assert info["distributed_type"] == "NO" and info["num_processes"] == 1
    model = AutoModelForSeq2SeqLM.from_pretrained(reference_run)
    tokenizer = AutoTokenizer.from_pretrained(reference_run)
    assert isinstance(model, modeling.ScaleformerForConditionalGeneration)
    assert model.config.d_model == tiny_config["d_model"] and len(tokenizer) == model.config.vocab_size
    saved = load_file(reference_run / "checkpoints" / f"step_{STEPS}" / "model.safetensors")
    final = model.state_dict()
    for name, tensor in saved.items():
        torch.testing.assert_close(final[name], tensor, rtol=0, atol=0)


@pytest.mark.slow
def test_multi_gpu_launch_without_gpus_or_cpu_flag_is_refused(workdir: Path) -> None:
    """Without ACCELERATE_USE_CPU the two launched processes would each train alone: the script refuses."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--main_process_port", "0", str(SCRIPT), "--model_config", str(workdir / "tiny.json"),
               "--data_dir", str(workdir / "data"), "--source_field", "src", "--target_field", "tgt",
               "--output_dir", str(workdir / "refused"), "--max_steps", "1", "--eval_steps", "0"]
    result = subprocess.run(command, env=clean_env(workdir, use_cpu=False), cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode != 0
    assert "ACCELERATE_USE_CPU=true" in result.stderr
    assert not (workdir / "refused" / "model.safetensors").exists()


def test_global_batches_are_seeded_and_split_without_overlap(train_accelerate: ModuleType) -> None:
    lengths = [(7 * i) % 23 + 1 for i in range(50)]
    plan = train_accelerate.GlobalBatchPlan(lengths, global_batch_size=8, seed=3, group_by_length=False)
    assert plan.steps_per_epoch == 6 and plan.dropped_per_epoch == 2
    epoch0 = [plan.global_batch(s) for s in range(6)]
    flat = [i for batch in epoch0 for i in batch]
    assert len(set(flat)) == 48
    assert all(lengths[a] >= lengths[b] for batch in epoch0 for a, b in zip(batch, batch[1:]))
    again = train_accelerate.GlobalBatchPlan(lengths, 8, seed=3, group_by_length=False)
    assert [again.global_batch(s) for s in range(6)] == epoch0
    assert plan.global_batch(6) != epoch0[0]  # the next epoch is another permutation
    other_seed = train_accelerate.GlobalBatchPlan(lengths, 8, seed=4, group_by_length=False)
    assert [other_seed.global_batch(s) for s in range(6)] != epoch0
    grouped = train_accelerate.GlobalBatchPlan(lengths, 8, seed=3, group_by_length=True)
    batches = sorted(([lengths[i] for i in grouped.global_batch(s)] for s in range(6)), reverse=True)
    assert len({i for s in range(6) for i in grouped.global_batch(s)}) == 48
    # one mega-batch here: the global batches cut a length-sorted order, so their ranges do not overlap
    assert all(min(longer) >= max(shorter) for longer, shorter in zip(batches, batches[1:]))

    for processes, per_device, accumulation in ((1, 8, 1), (2, 4, 1), (2, 2, 2), (4, 1, 2)):
        slices = [
            train_accelerate.local_micro_batch(epoch0[0], a, r, processes, per_device)
            for a in range(accumulation) for r in range(processes)
        ]
        assert all(len(s) == per_device for s in slices)
        assert sorted(i for s in slices for i in s) == sorted(epoch0[0])


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        pytest.param(["--max_steps", "0"], "--max_steps", id="max_steps"),
        pytest.param(["--per_device_batch_size", "0"], "--per_device_batch_size", id="batch_size"),
        pytest.param(["--eval_steps", "-1"], "--eval_steps", id="eval_steps"),
        pytest.param(["--source_field", "x", "--target_field", "x"], "--source_field", id="same_fields"),
        pytest.param(["--data_dir", "/nonexistent"], "--data_dir", id="data_dir"),
        pytest.param(["--learning_rate", "nan"], "--learning_rate", id="learning_rate"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(train_accelerate: ModuleType, argv: list[str],
                                                 named: str) -> None:
    with pytest.raises(ValueError, match=named):
        train_accelerate.parse_args(argv)


CONFIGS = {
    "ddp_multi_gpu.yaml": DistributedType.MULTI_GPU,
    "fsdp.yaml": DistributedType.FSDP,
    "deepspeed_zero2.yaml": DistributedType.DEEPSPEED,
    "cpu_2proc.yaml": DistributedType.MULTI_GPU,
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_accelerate_config_parses(name: str) -> None:
    path = CONFIG_DIR / name
    config = load_config_from_file(str(path))  # raises on keys ClusterConfig does not know
    assert isinstance(config, ClusterConfig)
    assert config.distributed_type == CONFIGS[name]
    assert config.num_processes >= 2 and config.num_machines == 1
    header = path.read_text().split("compute_environment")[0]
    assert f"accelerate launch --config_file configs/accelerate/{name}" in header
    assert "examples/train_accelerate.py" in header

    # nested keys become `accelerate launch` options: each must be one the launcher knows
    parser = launch_command_parser()
    options = {action.dest for action in parser._actions}
    for key in [*config.fsdp_config, *config.deepspeed_config]:
        assert key in options, f"{name}: {key} is not an accelerate launch option"
    args, _, _ = _validate_launch_command(parser.parse_args(["--config_file", str(path), str(SCRIPT)]))
    assert args.num_processes == config.num_processes
    if CONFIGS[name] == DistributedType.FSDP:
        assert args.use_fsdp and str(args.fsdp_version) == "2"
        for cls_name in args.fsdp_transformer_layer_cls_to_wrap.split(","):
            assert isinstance(getattr(modeling, cls_name), type), cls_name
    elif CONFIGS[name] == DistributedType.DEEPSPEED:
        assert args.use_deepspeed and args.zero_stage == 2
        # left to the script so that --gradient_accumulation_steps and --max_grad_norm hold
        assert args.gradient_accumulation_steps is None and args.gradient_clipping is None
    else:
        assert args.multi_gpu
    if name == "cpu_2proc.yaml":
        assert config.use_cpu and args.mixed_precision == "no" and config.main_process_port == 0
