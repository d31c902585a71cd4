"""The key trees jrl has built in, one per program, and the verl configs each stands for.

verl's programs compose their config from YAML files that Hydra picks by name
(``--config-path=config --config-name=ppo_megatron_trainer``). jrl reads no YAML: each program
has its key tree in Python, and a `--config-name` only has to name a config of that program.
`ppo_trainer` and `ppo_megatron_trainer` are the same tree here (the document's defaults, with
Megatron's ``megatron`` sections in it); a recipe's config (`dapo_trainer`) is that tree with
the recipe's own values over it (`layers`, from `jrl.config.recipes`). ``--config-path`` names
where verl keeps its YAML and is not read. With ``--config=FILE.py`` as well, the card is the
base and the name is only checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from ml_collections import ConfigDict

from jrl.config.defaults import default_config, default_templates
from jrl.config.errors import ConfigError
from jrl.config.eval_defaults import evaluation_config, generation_config
from jrl.config.recipes import DAPO_TRAINER, FULLY_ASYNC_TRAINER, ONE_STEP_OFF_TRAINER, Layer
from jrl.config.sft_defaults import sft_config, sft_templates


@dataclasses.dataclass(frozen=True)
class KeyTree:
    """The keys of `program` with their defaults (`defaults()`: linked and locked;
    `templates()`: interpolations still ``${...}`` text), the names of the verl configs whose
    keys it holds (``--config-name``) and, by name, the values a recipe's config sets over the
    defaults (`layers`)."""

    program: str
    names: tuple[str, ...]
    defaults: Callable[[], ConfigDict]
    templates: Callable[[], ConfigDict]
    layers: Mapping[str, Layer] = dataclasses.field(default_factory=dict)

    def layer(self, name: str | None) -> Layer:
        """The values the config `name` (``--config-name``; None: none) sets over the defaults."""
        return self.layers.get(name or "", ())


PPO = KeyTree(
    "python -m jrl.train",
    (
        "ppo_trainer",
        "ppo_megatron_trainer",
        "dapo_trainer",
        "dapo_megatron_trainer",
        "one_step_off_ppo_trainer",
        "one_step_off_ppo_megatron_trainer",
        "fully_async_ppo_trainer",
        "fully_async_ppo_megatron_trainer",
    ),
    default_config,
    default_templates,
    {
        "dapo_trainer": DAPO_TRAINER,
        "dapo_megatron_trainer": DAPO_TRAINER,
        "one_step_off_ppo_trainer": ONE_STEP_OFF_TRAINER,
        "one_step_off_ppo_megatron_trainer": ONE_STEP_OFF_TRAINER,
        "fully_async_ppo_trainer": FULLY_ASYNC_TRAINER,
        "fully_async_ppo_megatron_trainer": FULLY_ASYNC_TRAINER,
    },
)
SFT = KeyTree("python -m jrl.sft", ("sft_trainer",), sft_config, sft_templates)
GENERATION = KeyTree(
    "python -m jrl.generate", ("generation",), generation_config, generation_config
)
EVALUATION = KeyTree(
    "python -m jrl.evaluate", ("evaluation",), evaluation_config, evaluation_config
)
TREES = (PPO, SFT, GENERATION, EVALUATION)


def check_config_name(name: str | None, tree: KeyTree) -> None:
    """ConfigError unless `name` (``--config-name``, None when not given) is one of `tree`'s."""
    if name is None or name in tree.names:
        return
    owner = next((other for other in TREES if name in other.names), None)
    if owner is not None:
        raise ConfigError(
            f"--config-name={name} is verl's config of {owner.program}; {tree.program} reads "
            f"{' or '.join(tree.names)}"
        )
    known = "; ".join(f"{', '.join(t.names)} ({t.program})" for t in TREES)
    raise ConfigError(
        f"unknown --config-name={name}: jrl knows verl's {known}. jrl reads no YAML files: "
        "write your settings as overrides or in a card (--config=FILE.py)"
    )
