"""Every key of the document and of verl v0.6.0's generated PPO config acts, is announced or is
refused on the tiny PPO card (`every_key` says how this is checked)."""

from every_key import card_reads, wrong_verdicts


def test_every_key_acts_is_announced_or_is_refused(tmp_path):
    wrong = wrong_verdicts("ppo", card_reads("ppo", tmp_path))
    assert not wrong, "\n".join(f"{k}: {v}" for k, v in wrong.items())
