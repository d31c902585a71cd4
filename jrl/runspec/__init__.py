"""The one door from verl's keys to what a run does: every check of a config (`validate`), the
run's shape (`uses_critic`, `uses_reference`, `n_gpus`), the notice of keys that have no effect
here (`effects`) and the cards' laptop presets (`presets`). Above the mechanisms, it is the only
package that knows verl's key paths."""

from jrl.runspec.loading import load_config
from jrl.runspec.presets import apply_preset, apply_sft_preset
from jrl.runspec.shape import n_gpus, uses_critic, uses_reference
from jrl.runspec.validate import validate, validate_sft

__all__ = [
    "apply_preset",
    "apply_sft_preset",
    "load_config",
    "n_gpus",
    "uses_critic",
    "uses_reference",
    "validate",
    "validate_sft",
]
