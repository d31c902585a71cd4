"""The DataLoader: collation, verl's epoch orders (torch's samplers), per-process sharding,
resumable state."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from jrl.batch import Batch
from jrl.data import DataLoader, RLDataset, collate, train_tiny_tokenizer
from jrl.data.gsm8k import gsm8k_rows


def toy_rows(n):
    return [
        {
            "input_ids": np.full(3, i),
            "attention_mask": np.ones(3, int),
            "position_ids": np.arange(3),
            "uid": f"u{i}",
        }
        for i in range(n)
    ]


def epoch_ids(loader, epoch):
    return [batch["input_ids"][:, 0].tolist() for batch in loader.epoch(epoch)]


def test_collate():
    batch = collate(toy_rows(2))
    assert isinstance(batch, Batch) and len(batch) == 2
    assert batch["input_ids"].dtype == np.int32 and batch["input_ids"].shape == (2, 3)
    assert batch.meta["uid"].dtype == object and list(batch.meta["uid"]) == ["u0", "u1"]
    rows = toy_rows(2)
    del rows[1]["uid"]
    with pytest.raises(KeyError, match="row 1 has fields"):
        collate(rows)


@pytest.mark.parametrize("rows, batch_size, seed", [(10, 3, 42), (37, 8, 1), (7473, 1024, 42)])
def test_rl_epochs_are_torchs_random_sampler_with_one_generator(rows, batch_size, seed):
    """verl's RL loader: a RandomSampler whose generator is seeded once with data.seed."""
    generator = torch.Generator().manual_seed(seed)
    sampler = torch.utils.data.RandomSampler(range(rows), generator=generator)
    batches = torch.utils.data.BatchSampler(sampler, batch_size, drop_last=True)
    loader = DataLoader(list(range(rows)), batch_size, shuffle=True, seed=seed)
    for epoch in range(3):
        ours = [
            loader.order(epoch)[i * batch_size : (i + 1) * batch_size] for i in range(len(loader))
        ]
        np.testing.assert_array_equal(ours, [list(batch) for batch in batches])


def test_sft_epochs_are_torchs_distributed_sampler_per_global_batch():
    """verl's SFT loader: each rank's DistributedSampler (seed 0, set_epoch) in batches of
    train_batch_size / world; jrl's global batch holds the rows of every rank's batch."""
    rows, world, local = 50, 4, 3
    loader = DataLoader(
        list(range(rows)), world * local, shuffle=True, seed=0, sampler="distributed"
    )
    for epoch in range(2):
        per_rank = []
        for rank in range(world):
            sampler = torch.utils.data.DistributedSampler(
                range(rows), num_replicas=world, rank=rank, shuffle=True, drop_last=True
            )
            sampler.set_epoch(epoch)
            per_rank.append(list(torch.utils.data.BatchSampler(sampler, local, drop_last=True)))
        order = loader.order(epoch)
        for step in range(len(loader)):
            theirs = sorted(i for rank_batches in per_rank for i in rank_batches[step])
            ours = sorted(order[step * world * local : (step + 1) * world * local].tolist())
            assert ours == theirs, (epoch, step)


def test_loader_length_order_and_reshuffle():
    rows = toy_rows(10)
    assert len(DataLoader(rows, 4, shuffle=True, seed=1)) == 2
    assert len(DataLoader(rows, 4, shuffle=True, seed=1, drop_last=False)) == 3
    assert epoch_ids(DataLoader(rows, 5, shuffle=False, seed=1), 3) == [
        [0, 1, 2, 3, 4],
        [5, 6, 7, 8, 9],
    ]
    full = DataLoader(rows, 4, shuffle=True, seed=1, drop_last=False)
    epochs = [sum(epoch_ids(full, e), []) for e in range(3)]
    assert all(sorted(e) == list(range(10)) for e in epochs)
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]
    again = DataLoader(rows, 4, shuffle=True, seed=1, drop_last=False)
    assert sum(epoch_ids(again, 1), []) == epochs[1]
    other_seed = DataLoader(rows, 4, shuffle=True, seed=2, drop_last=False)
    assert sum(epoch_ids(other_seed, 0), []) != epochs[0]
    assert [len(b) for b in epoch_ids(DataLoader(rows, 4, shuffle=True, seed=1), 0)] == [4, 4]
    with pytest.raises(ValueError, match="larger than the dataset"):
        DataLoader(rows, 11, shuffle=True, seed=1)


def test_loader_state_round_trip():
    rows = toy_rows(12)
    reference = epoch_ids(DataLoader(rows, 3, shuffle=True, seed=5), 1)
    loader = DataLoader(rows, 3, shuffle=True, seed=5)
    assert loader.get_state() == {"epoch": 0, "position": 0}
    stream = loader.epoch(1)
    seen = [next(stream)["input_ids"][:, 0].tolist() for _ in range(2)]
    state = loader.get_state()
    assert state == {"epoch": 1, "position": 2}
    resumed = DataLoader(rows, 3, shuffle=True, seed=5)
    resumed.set_state(state)
    assert seen + epoch_ids(resumed, 1) == reference
    assert resumed.get_state() == {"epoch": 2, "position": 0}
    assert len(epoch_ids(resumed, 2)) == 4
    with pytest.raises(KeyError, match="lacks"):
        resumed.set_state({"epoch": 1})
    resumed.set_state({"epoch": 1, "position": 9})
    with pytest.raises(ValueError, match="resumes epoch 1 at batch 9.*only 4 batches"):
        epoch_ids(resumed, 1)


def test_each_process_reads_its_slice_of_every_global_batch():
    rows = toy_rows(16)
    single = DataLoader(rows, 8, shuffle=True, seed=3)
    shards = [
        DataLoader(rows, 8, shuffle=True, seed=3, process_index=p, process_count=4)
        for p in range(4)
    ]
    assert [len(s) for s in shards] == [2, 2, 2, 2]
    for epoch in range(2):
        per_process = [epoch_ids(s, epoch) for s in shards]
        for b, global_batch in enumerate(epoch_ids(single, epoch)):
            assert [per_process[p][b] for p in range(4)] == [
                global_batch[2 * p : 2 * p + 2] for p in range(4)
            ]
    # The default is this process of the JAX runtime: one process here, so nothing is split.
    assert epoch_ids(DataLoader(rows, 8, shuffle=True, seed=3), 0) == epoch_ids(single, 0)
    with pytest.raises(ValueError, match="batch size 6 does not split evenly over 4 processes"):
        DataLoader(rows, 6, shuffle=True, seed=3, process_index=0, process_count=4)
    uneven = [
        epoch_ids(
            DataLoader(
                rows, 7, shuffle=False, seed=0, drop_last=False, process_index=p, process_count=2
            ),
            0,
        )[-1]
        for p in range(2)
    ]
    assert uneven == [[14], [15]]


def test_sharded_state_round_trip():
    rows = toy_rows(24)
    reference = epoch_ids(
        DataLoader(rows, 6, shuffle=True, seed=9, process_index=1, process_count=2), 0
    )
    loader = DataLoader(rows, 6, shuffle=True, seed=9, process_index=1, process_count=2)
    stream = loader.epoch(0)
    seen = [next(stream)["input_ids"][:, 0].tolist()]
    resumed = DataLoader(rows, 6, shuffle=True, seed=9, process_index=1, process_count=2)
    resumed.set_state(loader.get_state())
    assert seen + epoch_ids(resumed, 0) == reference


def test_loader_over_rl_dataset(tmp_path):
    import ml_collections

    records = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(5)]
    path = tmp_path / "d.parquet"
    rows = gsm8k_rows(records, "t")
    pq.write_table(pa.Table.from_pylist(rows), path)
    texts = [row["prompt"][0]["content"] for row in rows]
    tokenizer = train_tiny_tokenizer(texts, tmp_path / "tok", 400)
    config = ml_collections.ConfigDict(
        dict(prompt_key="prompt", max_prompt_length=64, truncation="error", return_raw_chat=True)
    )
    dataset = RLDataset(str(path), tokenizer, config)
    (batch,) = list(DataLoader(dataset, 4, shuffle=True, seed=0).epoch(0))
    assert sorted(batch.tensors) == ["attention_mask", "input_ids", "position_ids"]
    assert batch["input_ids"].shape == (4, 64) and batch["input_ids"].dtype == np.int32
    assert {"raw_prompt", "raw_prompt_ids", "reward_model", "extra_info", "index"} <= set(
        batch.meta
    )
    assert len(set(batch.meta["index"])) == 4
    row = batch.meta["index"][0]
    np.testing.assert_array_equal(batch["input_ids"][0], dataset[row]["input_ids"])
