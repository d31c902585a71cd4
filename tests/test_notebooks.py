"""The notebooks of notebooks/, executed end to end on the CPU with the tiny preset and offline
data (their parameters cell overridden, as papermill does), and kept without outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers import REPO

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = REPO / "notebooks"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def execute(name: str, workdir: Path, **parameters) -> nbformat.NotebookNode:
    """Runs notebook `name` in `workdir` with `parameters` set after its parameters cell."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    (index,) = [
        i for i, cell in enumerate(notebook.cells) if "parameters" in cell.metadata.get("tags", [])
    ]
    values = {"JRL_DIR": str(REPO), "INSTALL": False, "PRESET": "tiny", **parameters}
    source = "\n".join(f"{key} = {value!r}" for key, value in values.items())
    injected = nbformat.v4.new_code_cell(source)
    injected.metadata["tags"] = ["injected-parameters"]
    notebook.cells.insert(index + 1, injected)
    client = nbclient.NotebookClient(
        notebook,
        timeout=900,
        kernel_name="python3",
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()
    return notebook


def images(notebook: nbformat.NotebookNode) -> int:
    """How many PNG outputs the executed notebook shows."""
    return sum(
        "image/png" in output.get("data", {})
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
    )


def summary(workdir: Path, run: str) -> dict:
    return json.loads((workdir / "runs" / run / "summary.json").read_text())


def assert_png(path: str | Path) -> None:
    assert Path(path).read_bytes()[:8] == PNG_MAGIC, path


def assert_score(value: float) -> None:
    assert math.isfinite(value) and 0.0 <= value <= 1.0, value


@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_notebooks_are_stored_without_outputs(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(not cell.outputs and cell.execution_count is None for cell in code)
    tagged = [cell for cell in code if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1, "one parameters cell"


def test_grpo_gsm8k_small(tmp_path):
    notebook = execute("grpo_gsm8k_small.ipynb", tmp_path, OFFLINE_DATA=True, STEPS=3)
    result = summary(tmp_path, "grpo_gsm8k_small")
    assert result["steps"] == 3
    assert_score(result["reward"])
    assert 0 < result["response_length"] <= 16  # the tiny preset's max_response_length
    (score,) = result["validation"].values()
    assert_score(score)
    for when in ("before", "after"):
        scores = result["test_score"][when]
        assert_score(scores["test_score/openai/gsm8k"])
        assert set(scores) >= {"pass@1/openai/gsm8k", "pass@4/openai/gsm8k"}
    exported = Path(result["exported_model"])
    assert (exported / "config.json").is_file() and list(exported.glob("*.safetensors"))
    plots = {Path(p).name for p in result["plots"]}
    assert {"live.png", "reward.png", "response_length.png", "validation.png"} <= plots
    for plot in result["plots"]:
        assert_png(plot)
    assert images(notebook) >= 2  # the live plot, and the saved plots shown at the end


def test_sft_then_ppo(tmp_path):
    notebook = execute("sft_then_ppo.ipynb", tmp_path, OFFLINE_DATA=True, SFT_STEPS=4, PPO_STEPS=2)
    result = summary(tmp_path, "sft_then_ppo")
    assert result["sft"]["step"] == 4
    assert math.isfinite(result["sft"]["train/loss"]) and math.isfinite(result["sft"]["val/loss"])
    ppo = result["ppo"]
    assert ppo["step"] == 2
    assert math.isfinite(ppo["critic/vf_loss"]) and math.isfinite(ppo["critic/vf_explained_var"])
    assert_score(ppo["critic/score/mean"])
    sft_model = Path(result["sft_model"])
    assert (sft_model / "config.json").is_file() and (sft_model / "tokenizer.json").is_file()
    plots = [Path(p) for p in result["plots"]]
    assert {(p.parent.parent.name, p.name) for p in plots} >= {
        ("sft", "live.png"),
        ("ppo", "live.png"),
    }
    for plot in plots:
        assert_png(plot)
    assert images(notebook) >= 3


def test_custom_reward(tmp_path):
    notebook = execute("custom_reward.ipynb", tmp_path, STEPS=2)
    outputs = "".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
    )
    # the hand checks of the reward function: right, wrong number (format_score), no answer
    assert "1.0\n0.1\n0.0\n" in outputs
    result = summary(tmp_path, "custom_reward")
    assert result["steps"] == 2
    assert_score(result["reward"])
    assert result["validation"] and all(
        key.startswith("val-core/addition/") for key in result["validation"]
    )
    for value in result["validation"].values():
        assert_score(value)
    for plot in result["plots"]:
        assert_png(plot)
    assert images(notebook) >= 2


def test_run_reports_a_failed_command_with_its_last_lines(tmp_path):
    from jrl import notebook

    with pytest.raises(RuntimeError, match=r"jrl.train failed \(exit status 2\)(.|\n)*missing\.py"):
        notebook.run("jrl.train", [f"--config={tmp_path}/missing.py"], run_dir=tmp_path / "run")
    assert "missing.py" in (tmp_path / "run" / "jrl.train.log").read_text()
