"""`TurnSession` (`jrl.rollout.session`): slots that live across turns, each writing at its own
column. A row's turn samples what `generate` samples for it (its keys follow its row and turn,
never its slot or its companions), whether it runs with all rows or alone, in its first slot or
one another row freed, and a later turn prefills only what the row appended."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from fake_vllm import prompt_batch
from helpers import TINY_LLAMA
from jax.sharding import Mesh

from jrl.models import init_random
from jrl.parallel import MESH_AXES
from jrl.rollout import EngineLimits, JaxRollout, SamplingParams

ROWS, WIDTH, RESPONSE = 7, 8, 12


def engine(replicas: int = 1, max_num_seqs: int = 256) -> JaxRollout:
    mesh = Mesh(np.asarray(jax.devices()[:replicas]).reshape(replicas, 1, 1, 1), MESH_AXES)
    return JaxRollout(init_random(TINY_LLAMA, seed=0), response_length=RESPONSE, pad_token_id=0,
                      eos_token_ids=(1,), mesh=mesh,
                      limits=EngineLimits(max_num_seqs=max_num_seqs))  # fmt: skip


def prompts() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    ids, mask = np.zeros((ROWS, WIDTH), np.int32), np.zeros((ROWS, WIDTH), np.int32)
    for i in range(ROWS):
        n = int(rng.integers(2, WIDTH + 1))
        ids[i, WIDTH - n :], mask[i, WIDTH - n :] = rng.integers(2, 64, n), 1
    return ids, mask


def sampling(do_sample: bool) -> SamplingParams:
    return SamplingParams(max_new_tokens=RESPONSE, eos_token_ids=(1,), pad_token_id=0, n=1,
                          do_sample=do_sample, calculate_log_probs=True)  # fmt: skip


def run_session(session, asked: dict[int, list[int]], limit: int = RESPONSE) -> dict:
    """Every turn of `asked` (row -> context) to its end, each row's slot freed as it ends."""
    for row, context in asked.items():
        session.ask(row, context, limit)
    ended = {}
    while session.ready:
        for turn in session.step():
            ended[turn.row] = turn
            session.release(turn.row)
    return ended


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize(("replicas", "max_num_seqs"), [(1, 256), (2, 2)])
def test_first_turns_sample_what_generate_samples(do_sample, replicas, max_num_seqs):
    """With two replicas of two slots, three rows wait for a slot that another row frees."""
    rollout = engine(replicas, max_num_seqs)
    ids, mask = prompts()
    key = jax.random.key(3)
    out = rollout.generate(prompt_batch(ids, mask), sampling(do_sample), key)
    session = rollout.open_session(ROWS, WIDTH, sampling(do_sample), key, steps=4)
    assert session.slots * session.replicas == min(8, replicas * max_num_seqs)
    ended = run_session(session, {i: ids[i][mask[i] == 1].tolist() for i in range(ROWS)})
    lengths = np.asarray(out["response_mask"]).sum(-1)
    for i in range(ROWS):
        n = int(lengths[i])
        assert ended[i].token_ids == np.asarray(out["responses"])[i, :n].tolist(), i
        expected = np.asarray(out["rollout_log_probs"])[i, :n]
        np.testing.assert_allclose(ended[i].log_probs, expected, atol=2e-6)
    assert session.prefilled_tokens == int(mask.sum())


def test_a_later_turn_prefills_what_its_row_appended_and_samples_as_the_whole_history():
    """Turn 1 of each row, after its first turn and three appended tokens, samples what one
    call over the whole history samples for that row and turn (`generate_turn` with
    ``fold_in(key, 1)``), and prefills only the row's last sampled token and the three."""
    rollout = engine()
    ids, mask = prompts()
    key, params = jax.random.key(4), sampling(True)
    session = rollout.open_session(ROWS, WIDTH, params, key, steps=4)
    firsts = {i: ids[i][mask[i] == 1].tolist() for i in range(ROWS)}
    for row, context in firsts.items():
        session.ask(row, context, 5)
    first = {}
    while len(first) < ROWS:
        first.update({turn.row: turn for turn in session.step()})
    later = {i: firsts[i] + first[i].token_ids + [20, 30 + i, 40] for i in range(ROWS)}
    before = session.prefilled_tokens
    second = run_session(session, later, limit=4)
    assert session.prefilled_tokens - before == 4 * ROWS
    width = max(map(len, later.values()))
    ids2 = np.zeros((ROWS, width), np.int32)
    mask2 = np.zeros((ROWS, width), np.int32)
    for i, context in later.items():
        ids2[i, width - len(context) :], mask2[i, width - len(context) :] = context, 1
    four = dataclasses.replace(params, max_new_tokens=4)
    batch = prompt_batch(ids2, mask2)
    later_key = jax.random.fold_in(key, 1)  # turn_key(key, 1)
    turn = rollout.generate_turn(batch, four, later_key, None, row_ids=list(range(ROWS)))
    lengths = np.asarray(turn["response_mask"]).sum(-1)
    for i in range(ROWS):
        assert second[i].token_ids == np.asarray(turn["responses"])[i, : lengths[i]].tolist()


def test_a_context_longer_than_a_slot_is_refused_naming_the_row():
    session = engine().open_session(ROWS, WIDTH, sampling(False), jax.random.key(0))
    with pytest.raises(ValueError, match="row 5's context has 21 tokens, more than the 20"):
        session.ask(5, list(range(2, 23)), 4)
