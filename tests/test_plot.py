"""python -m jrl.plot: PNGs from metrics.jsonl, skipped figures, errors, graceful degradation."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from jrl import plot

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REPO = Path(__file__).resolve().parents[1]


def _write(run_dir: Path, rows: list[tuple[int, dict]]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": step, "data": data}) for step, data in rows]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _train_row(step: int, **extra) -> tuple[int, dict]:
    data = {
        "critic/score/mean": 0.1 * step,
        "critic/score/min": 0.0,
        "critic/score/max": 1.0,
        "response_length/mean": 10.0 + step,
        "actor/kl_loss": 0.01 * step,
        "actor/ppo_kl": "nan",
        "actor/entropy": 2.0 - 0.1 * step,
        "training/global_step": step,
        **extra,
    }
    return step, data


def _is_png(path: Path) -> bool:
    data = path.read_bytes()
    return data.startswith(PNG_SIGNATURE) and len(data) > 1000


def test_plots_every_figure_with_data(tmp_path):
    val = {"val-core/openai/gsm8k/reward/mean@1": 0.2, "val-core/math/acc/mean@1": 0.1}
    rows = [(0, val), _train_row(1), _train_row(2), _train_row(3), (3, val)]
    _write(tmp_path, rows)
    paths = plot.plot_run(tmp_path)
    assert [p.name for p in paths] == [
        "reward.png",
        "response_length.png",
        "kl.png",
        "entropy.png",
        "validation.png",
    ]
    assert all(p.parent == tmp_path / "plots" and _is_png(p) for p in paths)
    assert not list((tmp_path / "plots").glob(".*"))  # no temporary files left


def test_resumed_steps_keep_the_last_row_and_text_values_parse(tmp_path):
    _write(tmp_path, [_train_row(1), _train_row(2), (2, {"actor/entropy": 9.0}), _train_row(3)])
    series = plot.read_metrics(tmp_path / "metrics.jsonl")
    assert series["actor/entropy"] == [(1, 1.9), (2, 9.0), (3, 1.7)]
    assert [s for s, _ in series["actor/ppo_kl"]] == [1, 2, 3]  # "nan" kept as NaN


def test_figures_without_data_are_skipped(tmp_path):
    _write(tmp_path, [(1, {"critic/score/mean": 0.5, "actor/ppo_kl": "nan"})])
    paths = plot.plot_run(tmp_path)
    assert [p.name for p in paths] == ["reward.png"]  # an all-NaN KL curve is no data


def test_cli_errors_name_the_file(tmp_path, capsys):
    assert plot.main([str(tmp_path)]) == 2
    assert str(tmp_path / "metrics.jsonl") in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text("")
    assert plot.main([str(tmp_path)]) == 2
    assert "empty" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert plot.main([str(tmp_path)]) == 2
    assert "metrics.jsonl:1" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "data": {}}\n{"step": 2, "data": [1]}\n')
    assert plot.main([str(tmp_path)]) == 2
    assert "metrics.jsonl:2" in capsys.readouterr().err


def test_module_entry_point(tmp_path):
    _write(tmp_path, [_train_row(1), _train_row(2)])
    done = subprocess.run(
        [sys.executable, "-m", "jrl.plot", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert str(tmp_path / "plots" / "reward.png") in done.stdout.splitlines()
    helped = subprocess.run(
        [sys.executable, "-m", "jrl.plot", "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert helped.returncode == 0 and "RUN_DIR" in helped.stdout


def test_after_training_degrades_without_matplotlib(tmp_path, monkeypatch, capsys):
    _write(tmp_path, [_train_row(1)])
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a),
    )
    with pytest.raises(ImportError, match=r"jrl\[plot\]"):
        plot.plot_run(tmp_path)
    assert plot.plot_after_training(tmp_path) == []
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "plots skipped" in lines[0] and 'pip install "jrl[plot]"' in lines[0]
    assert not (tmp_path / "plots").exists()


def test_after_training_reports_where_plots_went(tmp_path, capsys):
    _write(tmp_path, [_train_row(1)])
    assert len(plot.plot_after_training(tmp_path)) == 4
    assert capsys.readouterr().out.strip() == f"jrl: 4 plots written to {tmp_path / 'plots'}"
    assert plot.plot_after_training(tmp_path / "missing") == []
    assert "plots skipped" in capsys.readouterr().out


def test_validation_summary_gives_first_and_last_score_steps_time_and_plot(tmp_path):
    val = "val-core/openai/gsm8k/reward/mean@1"
    rows = [(0, {val: 0.1875}), _train_row(1), _train_row(2), (2, {val: 0.25})]
    rows += [_train_row(3), (3, {val: 0.4531, "val-core/openai/gsm8k/reward/mean@4": 0.9})]
    _write(tmp_path, rows)
    plots = [tmp_path / "plots" / "reward.png", tmp_path / "plots" / "validation.png"]
    line = plot.validation_summary(tmp_path, 461.4, plots)
    assert line == (
        f"val reward 0.19 -> 0.45 in 3 steps, 7m41s; plot: {tmp_path / 'plots' / 'validation.png'}"
    )
    assert (
        plot.validation_summary(tmp_path, 59.6, []) == "val reward 0.19 -> 0.45 in 3 steps, 1m00s"
    )


def test_validation_summary_reads_only_the_rows_this_run_appended(tmp_path):
    """An earlier run left two validations in the folder; this run (validation off) appended
    its training rows at the same steps: no summary, not the earlier run's."""
    val = "val-core/jrl/digits/reward/mean@1"
    _write(tmp_path, [(0, {val: 0.2}), _train_row(1), (1, {val: 0.6})])
    start = (tmp_path / plot.METRICS_FILE).stat().st_size
    assert (
        plot.validation_summary(tmp_path, 10.0, []) == "val reward 0.20 -> 0.60 in 1 steps, 0m10s"
    )
    with open(tmp_path / plot.METRICS_FILE, "a", encoding="utf-8") as out:
        for step in (1, 2):
            out.write(json.dumps({"step": step, "data": _train_row(step)[1]}) + "\n")
    assert plot.validation_summary(tmp_path, 10.0, [], start) is None
    series = plot.read_metrics(tmp_path / plot.METRICS_FILE, start)
    assert not any(key.startswith("val-core/") for key in series)
    assert [step for step, _ in series["critic/score/mean"]] == [1, 2]


def test_validation_summary_needs_two_validations(tmp_path):
    _write(tmp_path, [(0, {"val-core/jrl/digits/reward/mean@1": 0.5}), _train_row(1)])
    assert plot.validation_summary(tmp_path, 10.0, []) is None
    assert plot.validation_summary(tmp_path / "missing", 10.0, []) is None
