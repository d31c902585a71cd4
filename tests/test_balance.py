"""Workload-balanced row order (``trainer.balance_batch``): verl's Karmarkar–Karp and metrics."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from jrl import algos
from jrl.batch import Batch
from jrl.trainer.update.balance import balance_batch, balanced_order
from jrl.trainer.update.partition import karmarkar_karp, workload


def _batch(lengths: list[int], width: int = 64, group: int = 2) -> Batch:
    mask = (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    rows = len(lengths)
    return Batch(
        {"attention_mask": mask, "row": np.arange(rows)},
        {"uid": [f"p{i // group}" for i in range(rows)], "tag": [f"r{i}" for i in range(rows)]},
    )


def _spread(values: list[int], parts: list[list[int]]) -> int:
    sums = [sum(values[i] for i in part) for part in parts]
    return max(sums) - min(sums)


def _best_spread(values: list[int], k: int) -> int:
    """The smallest spread over every split into k equal-count parts (brute force)."""
    size = len(values) // k

    def splits(rest: tuple[int, ...]):
        if not rest:
            yield []
            return
        head, tail = rest[0], rest[1:]
        for others in itertools.combinations(tail, size - 1):
            remaining = tuple(i for i in tail if i not in others)
            for tail_split in splits(remaining):
                yield [[head, *others], *tail_split]

    return min(_spread(values, parts) for parts in splits(tuple(range(len(values)))))


def test_workload_formula():
    assert workload([0, 1, 10, 4096]).tolist() == [0, 24577, 245860, 24576 * 4096 + 4096**2]


def test_hand_worked_orders():
    # lengths 10,20,30,40: chunks {10,20},{30,40}; the wider pair pops first and takes 40+10
    batch, metrics = balance_batch(_batch([10, 20, 30, 40]), dp_size=2)
    assert batch["row"].tolist() == [0, 3, 1, 2]
    assert metrics == {
        "global_seqlen/min": 30.0,
        "global_seqlen/max": 70.0,
        "global_seqlen/minmax_diff": 40.0,
        "global_seqlen/balanced_min": 50.0,
        "global_seqlen/balanced_max": 50.0,
        "global_seqlen/mean": 50.0,
    }
    # eight rows: two merge rounds, then equal totals -> the partition holding row 0 comes last;
    # inside a shard: lightest, third, .., heaviest, .., second lightest
    assert balanced_order([8, 1, 7, 2, 6, 3, 5, 4], 2) == [[1, 4, 2, 7], [3, 6, 0, 5]]


def test_balances_a_skewed_batch_and_moves_whole_rows():
    lengths = [4, 5, 6, 7, 40, 44, 50, 60]
    batch = _batch(lengths)
    out, metrics = balance_batch(batch, dp_size=4)
    order = out["row"]
    assert sorted(order.tolist()) == list(range(8))
    np.testing.assert_array_equal(out["attention_mask"], batch["attention_mask"][order])
    assert out["tag"].tolist() == [f"r{i}" for i in order]
    assert out["uid"].tolist() == [f"p{i // 2}" for i in order]
    work = workload(lengths).tolist()
    before = [list(range(i, i + 2)) for i in range(0, 8, 2)]
    after = [order[i : i + 2].tolist() for i in range(0, 8, 2)]
    assert _spread(work, after) < _spread(work, before)
    assert metrics["global_seqlen/minmax_diff"] == 110 - 9
    assert metrics["global_seqlen/balanced_max"] - metrics["global_seqlen/balanced_min"] < 101
    assert metrics["global_seqlen/mean"] == sum(lengths) / 4


@pytest.mark.parametrize("seed", range(6))
def test_partitions_are_equal_sized_and_near_optimal(seed):
    rng = np.random.default_rng(seed)
    for rows, k in ((4, 2), (6, 3), (8, 2), (8, 4)):
        values = rng.integers(1, 1000, rows).tolist()
        parts = karmarkar_karp(values, k)
        assert sorted(i for part in parts for i in part) == list(range(rows))
        assert {len(part) for part in parts} == {rows // k}
        sums = [sum(values[i] for i in part) for part in parts]
        assert sums == sorted(sums, reverse=True)
        best, got = _best_spread(values, k), _spread(values, parts)
        # merging largest-with-smallest never widens a spread, so KK is within the widest
        # spread of the initial k-row chunks of the sorted values
        ordered = sorted(values)
        bound = max(ordered[i + k - 1] - ordered[i] for i in range(0, rows, k))
        assert best <= got <= bound
        if rows == 4:
            assert got == best  # {a, d} | {b, c} is optimal for four values


def test_one_shard_keeps_every_row():
    out, metrics = balance_batch(_batch([3, 9, 1, 5, 7, 2]), dp_size=1)
    # sorted by workload (rows 2,5,0,3,4,1) then zig-zag: even positions, odd ones reversed
    assert out["row"].tolist() == [2, 0, 4, 1, 3, 5]
    assert metrics["global_seqlen/balanced_min"] == metrics["global_seqlen/max"] == 27.0


def test_rows_must_split_evenly():
    with pytest.raises(ValueError, match="6 rows cannot be split into 4"):
        balance_batch(_batch([1, 2, 3, 4, 5, 6]), dp_size=4)
    with pytest.raises(ValueError, match="needs `attention_mask`"):
        balance_batch(Batch({"x": np.zeros((2, 3))}), dp_size=1)


def test_grpo_advantages_do_not_depend_on_the_order():
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 60, 16).tolist()
    batch = _batch(lengths, group=4)
    scores = rng.integers(0, 2, (16, 5)).astype(np.float32)
    response_mask = np.ones((16, 5), np.float32)
    batch = batch.union(Batch({"scores": scores, "response_mask": response_mask}))

    def advantages(b: Batch) -> np.ndarray:
        adv, _ = algos.compute_advantage(
            "grpo",
            token_level_rewards=b["scores"],
            response_mask=b["response_mask"],
            index=b.meta["uid"],
            norm_adv_by_std_in_grpo=True,
        )
        return np.asarray(adv)

    out, _ = balance_batch(batch, dp_size=4)
    assert out["row"].tolist() != list(range(16))
    undone = np.empty_like(advantages(out))
    undone[out["row"]] = advantages(out)
    np.testing.assert_array_equal(undone, advantages(batch))
