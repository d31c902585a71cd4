"""Choosing the reward manager from the config (verl's ``load_reward_manager``).

reward_model.reward_manager names a built-in manager (`REWARD_MANAGERS`); with
``reward_manager.source=importlib`` the class is loaded from ``reward_manager.module.path`` /
``.name`` instead. The scoring function is the custom one (custom_reward_function.*) or the
manager's default, and reward_model.reward_kwargs are the manager's options.
"""

from __future__ import annotations

import inspect
from typing import Any

from transformers import PreTrainedTokenizerBase

from jrl.data.extern import load_object
from jrl.reward.base import RewardManager
from jrl.reward.batch import BatchRewardManager
from jrl.reward.custom import load_custom_reward_fn
from jrl.reward.dapo import DAPORewardManager
from jrl.reward.default import default_compute_score
from jrl.reward.naive import NaiveRewardManager
from jrl.reward.prime import PrimeRewardManager

REWARD_MANAGERS: dict[str, type[RewardManager]] = {
    "naive": NaiveRewardManager,
    "prime": PrimeRewardManager,
    "batch": BatchRewardManager,
    "dapo": DAPORewardManager,
}
SOURCES = ("register", "importlib")


def plain_dict(section: Any) -> dict[str, Any]:
    """A config section (ConfigDict, dict or None) as a plain dict."""
    if section is None:
        return {}
    return section.to_dict() if hasattr(section, "to_dict") else dict(section)


def manager_name(config: Any) -> tuple[str, str]:
    """(key, name) of the built-in reward manager: ``reward_manager.name`` (current verl's key)
    where it is set to something else than v0.6's ``reward_model.reward_manager`` (which it
    follows by default), else that key ('naive' when null)."""
    legacy = getattr(getattr(config, "reward_model", None), "reward_manager", None) or "naive"
    name = getattr(getattr(config, "reward_manager", None), "name", None)
    if name is not None and name != legacy:
        return "reward_manager.name", name
    return "reward_model.reward_manager", legacy


def reward_manager_class(config: Any) -> tuple[str, type]:
    """(name for messages, class) of the configured reward manager."""
    section = getattr(config, "reward_manager", None)
    source = getattr(section, "source", None) or "register"
    if source == "importlib":
        module = getattr(section, "module", None)
        path, name = getattr(module, "path", None), getattr(module, "name", None)
        return f"{name} from {path}", load_object(path, name, "reward_manager.module")
    if source not in SOURCES:
        raise ValueError(f"reward_manager.source={source!r} is not one of {', '.join(SOURCES)}")
    key, name = manager_name(config)
    if name not in REWARD_MANAGERS:
        raise ValueError(
            f"{key}={name!r} is not available; choose one of {', '.join(REWARD_MANAGERS)}"
        )
    return name, REWARD_MANAGERS[name]


def _check_options(cls: type, name: str, options: dict[str, Any]) -> None:
    parameters = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    fixed = {"self", "tokenizer", "num_examine", "compute_score", "reward_fn_key"}
    known = [p for p in parameters if p not in fixed]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(
            f"reward_model.reward_kwargs {unknown} are not options of the {name!r} reward "
            f"manager; its options are {', '.join(known) or 'none'}"
        )


def load_reward_manager(
    config: Any, tokenizer: PreTrainedTokenizerBase, num_examine: int, **reward_kwargs: Any
) -> Any:
    """The configured reward manager; `reward_kwargs` add to reward_model.reward_kwargs.

    Its result is called as ``manager(batch, return_dict=True)`` ->
    ``{"reward_tensor": float32 [B, R], "reward_extra_info": {key: per-row list}}``.
    """
    name, cls = reward_manager_class(config)
    options = {**plain_dict(getattr(config.reward_model, "reward_kwargs", None)), **reward_kwargs}
    _check_options(cls, name, options)
    compute_score = load_custom_reward_fn(config)
    reward_fn_key = getattr(getattr(config, "data", None), "reward_fn_key", None) or "data_source"
    if isinstance(cls, type) and issubclass(cls, RewardManager):
        return cls.from_config(
            config, tokenizer, num_examine, compute_score, reward_fn_key, **options
        )
    return cls(
        tokenizer=tokenizer,
        num_examine=num_examine,
        compute_score=compute_score or default_compute_score,
        reward_fn_key=reward_fn_key,
        **options,
    )
