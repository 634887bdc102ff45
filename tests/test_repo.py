"""The repository's own contracts: CI runs exactly the README's test command."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_command(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    block = re.search(rf"<!-- {marker} -->\s*```bash\n(.+?)\n```\s*<!-- /{marker} -->", text, re.S)
    assert block, f"README.md has no {marker} block"
    return block.group(1).strip()


def test_ci_runs_the_readme_test_command_in_a_fresh_virtual_environment():
    command = readme_command("test-command")
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert command in ci_lines
    assert "torch==2.13.0" in command
    # a new environment under a new temporary folder, activated before the command: nothing installed by hand
    # on the machine can make the tests pass
    venv = next(i for i, line in enumerate(ci_lines) if line.startswith("python3 -m venv \"$scratch"))
    activate = ci_lines.index('. "$scratch/venv/bin/activate"')
    assert 'scratch=$(mktemp -d)' in ci_lines[:venv] and venv < activate < ci_lines.index(command)


def test_readme_main_command_installs_pinned_torch_and_runs_main_job():
    command = readme_command("main-command")
    assert command.startswith("pip install torch==2.13.0 ")
    script = command.split("python ")[-1].split()[0]
    assert (ROOT / script).is_file()


def test_gpu_extra_takes_the_triton_of_cuda_builds_of_torch():
    """`pip install ".[gpu]"` beside a CUDA build of torch, which requires the Triton it was built with (3.6 for the
    torch 2.11 of the GPUs measured here), installs without a conflict; the test extra pins the interpreter the
    kernel tests run in."""
    import tomllib

    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    gpu, test = ({r.name: r for r in map(Requirement, extras[name])}["triton"] for name in ("gpu", "test"))
    assert {"3.6.0", "3.9.0"} <= set(gpu.specifier.filter(["3.5.0", "3.6.0", "3.9.0"]))
    assert "3.5.0" not in gpu.specifier  # without triton.constexpr_function
    assert str(test.specifier) == "==3.9.0"


def test_model_configs_load_and_build():
    import torch

    from modeling_scaleformer import ScaleformerConfig, ScaleformerForConditionalGeneration

    sizes = {}
    for name in ("tiny", "small", "base"):
        config = ScaleformerConfig.from_pretrained(ROOT / "configs" / f"scaleformer-{name}.json", vocab_size=8000)
        with torch.device("meta"):
            model = ScaleformerForConditionalGeneration(config)
        sizes[name] = sum(p.numel() for p in model.parameters())
    assert 7e6 < sizes["tiny"] < 9e6 and sizes["tiny"] < sizes["small"] < sizes["base"]
    # the shipped configurations are the default configuration at three sizes
    default = ScaleformerConfig()
    for name in ("tiny", "small", "base"):
        config = ScaleformerConfig.from_pretrained(ROOT / "configs" / f"scaleformer-{name}.json")
        for field in ("attention_type", "cross_attention_rpe", "layer_norm_position", "absolute_positions"):
            assert getattr(config, field) == getattr(default, field), (name, field)


def test_readme_quick_start_runs_as_written(tmp_path):
    """The quick start, verbatim, from a folder that has the repository's configs and examples."""
    block = re.search(r"<!-- quickstart -->\s*```python\n(.+?)\n```\s*<!-- /quickstart -->", (ROOT / "README.md").read_text(), re.S)
    assert block, "README.md has no quickstart block"
    for name in ("configs", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    result = subprocess.run([sys.executable, "-c", block.group(1)], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    generated = ast.literal_eval(result.stdout.strip().splitlines()[-1])  # the printed list of translations
    assert isinstance(generated, list) and len(generated) == 1 and isinstance(generated[0], str)
    assert (tmp_path / "outputs" / "my-scaleformer" / "modeling_scaleformer.py").is_file()


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation other than - and _ dropped."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_links_point_at_existing_files_and_sections():
    for page in ("README.md", "benchmarks/README.md", "examples/README.md"):
        text = (ROOT / page).read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith("http"):
                continue
            path, _, anchor = target.partition("#")
            linked = (ROOT / page).parent / path if path else ROOT / page
            assert linked.exists(), f"{page} links to missing {target}"
            if anchor:
                headings = re.findall(r"(?m)^#+ (.+)$", linked.read_text())
                assert anchor in {github_anchor(h) for h in headings}, f"{page} links to missing section {target}"
