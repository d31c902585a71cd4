"""Every key of the document and of verl v0.6.0's generated PPO config acts, is announced or is
refused on the tiny GRPO card (`every_key` says how this is checked)."""

from every_key import card_reads, verl_keys_missing_here, wrong_verdicts


def test_every_key_acts_is_announced_or_is_refused(tmp_path):
    wrong = wrong_verdicts("grpo", card_reads("grpo", tmp_path))
    assert not wrong, "\n".join(f"{k}: {v}" for k, v in wrong.items())


def test_verl_generated_keys_are_all_keys_here():
    assert not verl_keys_missing_here()
