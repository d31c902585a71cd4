"""No key does nothing silently, by what real runs do (`key_behaviour`): a key set to a
non-default value changes the run's metrics, compiled programs, files or resident memory, or
is named in the no-effect notice, or is refused.

CI probes a few keys of each kind on the GRPO card (about a minute); the full sweep of both
cards takes 10 (GRPO) and 18 (PPO) minutes on 2 cores and runs with ``JRL_KEY_SWEEP=1``:

    JRL_KEY_SWEEP=1 python -m pytest -q tests/test_key_behaviour.py
"""

import os

import pytest
from key_behaviour import sweep

KINDS = {
    "actor_rollout_ref.actor.optim.warmup_style": "acts: metrics",  # cosine instead of constant
    "actor_rollout_ref.rollout.max_num_seqs": "acts: metrics, programs",  # 2 slots decode
    "actor_rollout_ref.actor.fsdp_config.param_offload": "acts: resident",  # pinned host memory
    "data.prompt_key": "acts: metrics",  # another column of prompts
    "actor_rollout_ref.actor.use_torch_compile": "announced",
    "actor_rollout_ref.model.enable_activation_offload": "announced",  # on CPU only
    "actor_rollout_ref.model.mtp.enable": "refused",
}
GOOD = ("acts", "announced", "refused")


def test_a_few_keys_of_each_kind(tmp_path):
    outcomes = sweep("grpo", tmp_path, only=list(KINDS), say=lambda line: None)
    assert outcomes.pop("control") == "the same"
    for key, expected in KINDS.items():
        assert outcomes[key].startswith(expected), (key, outcomes[key])


@pytest.mark.skipif(
    not os.environ.get("JRL_KEY_SWEEP"), reason="10-18 min per card: JRL_KEY_SWEEP=1"
)
@pytest.mark.parametrize("card", ["grpo", "ppo"])
def test_no_key_of_the_cards_does_neither(card, tmp_path):
    outcomes = sweep(card, tmp_path, say=lambda line: None)
    assert outcomes.pop("control") == "the same"
    assert len(outcomes) > 400
    assert {k: v for k, v in outcomes.items() if not v.startswith(GOOD)} == {}
