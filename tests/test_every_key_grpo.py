"""Every key of the document and of verl v0.6.0's generated PPO config is read by the resolver,
is announced or is refused on the tiny GRPO card (`every_key` says how this is checked)."""

from every_key import verl_keys_missing_here, wrong_verdicts


def test_every_key_is_read_is_announced_or_is_refused():
    wrong = wrong_verdicts("grpo")
    assert not wrong, "\n".join(f"{k}: {v}" for k, v in wrong.items())


def test_verl_generated_keys_are_all_keys_here():
    assert not verl_keys_missing_here()
