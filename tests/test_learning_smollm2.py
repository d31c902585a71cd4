"""A real pretrained model learns under jrl: SmolLM2-135M-Instruct on the one-step word problems
(configs/word_problems_grpo.py), a short GRPO run against its own untrained start.

The bench (`python bench/learning.py --model smollm2`) shows the full curves over three seeds;
this is its shortest slice, with a threshold below what the bench measured at that step.
"""

from __future__ import annotations

import json

import pytest

from jrl import train

VAL = "val-core/jrl/word_problems/reward/mean@1"


@pytest.mark.slow
def test_grpo_raises_smollm2_held_out_accuracy(tmp_path):
    """The quickstart: 6 GRPO steps (16 answers each) and 64 held-out problems validated greedily
    before and after. Measured with this seed and verl's row order: 0.47, 0.48, 0.50, 0.61, 0.64
    at steps 0, 2, 4, 6, 8; with the advantages zeroed the policy never moves and the accuracy
    stays exactly where it started."""
    run_dir = tmp_path / "run"
    train.main(
        [
            "--config=configs/word_problems_grpo.py:quickstart",
            "trainer.logger=['file']",
            f"trainer.default_local_dir={run_dir}",
        ]
    )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    scores = {row["step"]: row["data"][VAL] for row in rows if VAL in row["data"]}
    assert sorted(scores) == [0, 6]
    assert 0.2 <= scores[0] <= 0.7, scores  # the untrained model: right about half the time
    assert scores[6] - scores[0] >= 0.08, scores
