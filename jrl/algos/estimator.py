"""What an advantage estimator needs and reads: its descriptor (`Estimator`), the registry of
descriptors (`ADV_ESTIMATORS`, `algorithm.adv_estimator`) and the `algorithm` options estimators
may read (`EstimatorOptions`).

Dispatch (`jrl.algos.compute_advantage`), validation, `uses_critic`, the no-effect notice and the
trainer (a greedy baseline rollout) ask the descriptor, so a new estimator is its function and its
registration:

    @register_adv_est("my_estimator", inputs=("reward_baselines",), options=("gamma",))
    def compute_my_advantage(token_level_rewards, response_mask, reward_baselines, gamma, **kwargs):
        ...

A function registered with verl's plain decorator, ``@register_adv_est("name")``, is called as
verl's trainer calls it: ``fn(token_level_rewards=..., response_mask=..., index=<uid>,
config=<the algorithm section, read-only>)``; it gets no critic and no greedy baseline, and it may
read any algorithm option.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence

from jrl.algos.registry import Registry

AdvantageFn = Callable[..., tuple]
# The batch inputs an estimator may need, and what each is (for the error when one is missing).
INPUTS = {
    "index": "one group id per row (the prompt's `uid`) to form groups",
    "values": "the critic's values per response token (enable the critic)",
    "reward_baselines": (
        "a greedy baseline rollout: the summed reward of a greedy response per prompt"
    ),
}
VERL_INPUTS = ("index",)


def _option(meaning: str) -> dataclasses.Field:
    return dataclasses.field(default=None, metadata={"meaning": meaning})


@dataclasses.dataclass(frozen=True)
class EstimatorOptions:
    """The ``algorithm`` options that advantage estimators read (verl's keyword names), as the
    resolver read them for the run's estimator: None where it does not read one."""

    gamma: float | None = _option("the discount algorithm.gamma")
    lam: float | None = _option("the GAE λ algorithm.lam")
    norm_adv_by_std_in_grpo: bool | None = _option(
        "algorithm.norm_adv_by_std_in_grpo: whether to divide by the group's std"
    )


OPTIONS = {f.name: f.metadata["meaning"] for f in dataclasses.fields(EstimatorOptions)}


@dataclasses.dataclass(frozen=True)
class Estimator:
    """An advantage estimator: its function, the batch `inputs` it cannot run without (keys of
    `INPUTS`) and the algorithm `options` it reads (fields of `EstimatorOptions`), both passed to
    it by keyword; `follows_verl`: registered with verl's plain decorator (see the module)."""

    name: str
    fn: AdvantageFn
    inputs: tuple[str, ...]
    options: tuple[str, ...]
    follows_verl: bool = False

    @property
    def needs_critic(self) -> bool:
        """Whether it reads the critic's values, so that the run trains a critic."""
        return "values" in self.inputs

    @property
    def needs_greedy_baseline(self) -> bool:
        """Whether the trainer must score a greedy answer per prompt (``reward_baselines``)."""
        return "reward_baselines" in self.inputs

    def reads(self, option: str) -> bool:
        """Whether it reads ``algorithm.<option>`` (verl's convention: it may read any)."""
        return self.follows_verl or option in self.options

    def required(self) -> tuple[str, ...]:
        """What a call must give: every input, and each option its function takes without a
        default."""
        params = inspect.signature(self.fn).parameters
        empty = inspect.Parameter.empty
        required = [o for o in self.options if o in params and params[o].default is empty]
        return (*self.inputs, *required)


ADV_ESTIMATORS: Registry[Estimator] = Registry(
    "advantage estimator",
    "algorithm.adv_estimator",
    lambda entry: entry.fn,
    built_in=("jrl.algos.advantages", "jrl.algos.group_baselines", "jrl.algos.token_returns"),
)


def register_adv_est(
    name_or_enum: object,
    *,
    inputs: Sequence[str] | None = None,
    options: Sequence[str] | None = None,
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator registering an advantage estimator under `name_or_enum` with what it needs:
    `inputs` (of `INPUTS`) and `options` (of `EstimatorOptions`). Without either it follows
    verl's calling convention (module docstring)."""
    follows_verl = inputs is None and options is None
    inputs = VERL_INPUTS if follows_verl else tuple(inputs or ())
    options = tuple(options or ())
    unknown = [k for k in inputs if k not in INPUTS] + [k for k in options if k not in OPTIONS]
    if unknown:
        raise ValueError(
            f"advantage estimator {name_or_enum!r}: unknown inputs or options {unknown}; inputs "
            f"are {', '.join(INPUTS)}, options {', '.join(OPTIONS)}"
        )

    return ADV_ESTIMATORS.register_with(
        name_or_enum, lambda name, fn: Estimator(name, fn, inputs, options, follows_verl)
    )


def get_adv_estimator(name: object) -> Estimator:
    """The descriptor registered under `name` (an unknown name lists the registered ones)."""
    return ADV_ESTIMATORS.get(name)


def get_adv_estimator_fn(name: object) -> AdvantageFn:
    """The function registered under `name` (verl's lookup)."""
    return ADV_ESTIMATORS.get(name).fn
