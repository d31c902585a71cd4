"""Building the reward manager of `RewardSettings` (verl's ``load_reward_manager``).

A built-in manager (`REWARD_MANAGERS`) is built with its typed options; a user's class
(``reward_manager.source=importlib``) is built as verl builds it, with keyword arguments
(tokenizer, num_examine, compute_score, reward_fn_key and reward_model.reward_kwargs). The
scoring function is the custom one (custom_reward_function.*) or the manager's default.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
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
from jrl.reward.settings import ManagerOptions, RewardSettings, UserManager, check_option_names

# The built-in manager class that takes each options type (`jrl.reward.settings.REWARD_MANAGERS`
# names the types).
_CLASSES: dict[type[ManagerOptions], type[RewardManager]] = {
    cls.Options: cls
    for cls in (NaiveRewardManager, PrimeRewardManager, BatchRewardManager, DAPORewardManager)
}
# verl's arguments of every reward manager; a user's class takes them and its own options.
_VERL_ARGS = ("self", "tokenizer", "num_examine", "compute_score", "reward_fn_key")


def _check_user_options(cls: type, name: str, options: Mapping[str, Any]) -> None:
    """reward_model.reward_kwargs must name parameters of the user's class (any, with **kwargs)."""
    parameters = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    check_option_names(name, [p for p in parameters if p not in _VERL_ARGS], options)


def _user_manager(
    settings: RewardSettings, tokenizer: PreTrainedTokenizerBase, num_examine: int
) -> Any:
    """The user's class, built with verl's keyword arguments and its options."""
    manager = settings.manager
    assert isinstance(manager, UserManager)
    cls = load_object(manager.path, manager.name, "reward_manager.module")
    _check_user_options(cls, f"{manager.name} from {manager.path}", manager.kwargs)
    compute_score = load_custom_reward_fn(settings.custom_function)
    return cls(
        tokenizer=tokenizer,
        num_examine=num_examine,
        compute_score=compute_score or default_compute_score,
        reward_fn_key=settings.reward_fn_key,
        **manager.kwargs,
    )


def load_reward_manager(
    settings: RewardSettings, tokenizer: PreTrainedTokenizerBase, num_examine: int
) -> Any:
    """The reward manager of `settings`.

    Its result is called as ``manager(batch, return_dict=True)`` ->
    ``{"reward_tensor": float32 [B, R], "reward_extra_info": {key: per-row list}}``.
    """
    if isinstance(settings.manager, UserManager):
        return _user_manager(settings, tokenizer, num_examine)
    options = settings.manager.options
    compute_score = load_custom_reward_fn(settings.custom_function)
    return _CLASSES[type(options)](
        tokenizer, num_examine, compute_score, settings.reward_fn_key, options
    )
