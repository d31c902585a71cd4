"""verl's deprecated keys and the keys that replace them: a run sets one key of each pair, and the
one set explicitly wins over a partner that holds only its default or an underlying layer's value.

Layers, lowest first: the defaults, the card (``--config=FILE.py``), the command line. A key
given at a layer (moved from its default by the card, named by an override) clears its partner
(sets it to null, verl's default for both) unless the same layer gives the partner too; then
both stay and `jrl.runspec.validate` reports the pair.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import MISSING

from ml_collections import ConfigDict

from jrl.config.moved import value_at
from jrl.config.tree import assign

# (section, deprecated key): verl's global micro-batch sizes, split over the devices, replaced by
# the key of the same name with ``_per_gpu``.
DEPRECATED_MICRO_BATCH_SIZES = (
    ("actor_rollout_ref.actor", "ppo_micro_batch_size"),
    ("actor_rollout_ref.rollout", "log_prob_micro_batch_size"),
    ("actor_rollout_ref.ref", "log_prob_micro_batch_size"),
    ("critic", "ppo_micro_batch_size"),
    ("critic", "forward_micro_batch_size"),
    ("reward_model", "micro_batch_size"),
)


def replaced_pairs(config: ConfigDict) -> Iterator[tuple[str, str]]:
    """(deprecated key, its replacement) of each pair that `config`'s tree holds."""
    for section, name in DEPRECATED_MICRO_BATCH_SIZES:
        pair = (f"{section}.{name}", f"{section}.{name}_per_gpu")
        if all(value_at(config, key) is not MISSING for key in pair):
            yield pair


def settle_pairs(config: ConfigDict, given: Collection[str]) -> None:
    """Clear (in place) the partner of each pair key that this layer `given` a value, unless the
    layer gave the partner a value too."""
    for pair in replaced_pairs(config):
        chosen = [key for key in pair if key in given and config[key] is not None]
        if len(chosen) == 1:
            partner = pair[1 - pair.index(chosen[0])]
            if config[partner] is not None:
                assign(config, partner, None)


def settle_card(card: ConfigDict, defaults: ConfigDict) -> None:
    """The card's layer of `settle_pairs`: the keys it moved away from `defaults` are its own."""
    keys = [key for pair in replaced_pairs(card) for key in pair]
    settle_pairs(card, [key for key in keys if card[key] != defaults[key]])
