"""The learning rate per scheduler step.

verl steps its LR scheduler once per training step (not per mini-batch), so the learning rate is a
host-side function of the scheduler step, injected into the optax state before each update
(`jrl.optim.optimizers.set_learning_rate`).
"""

from __future__ import annotations

import dataclasses
import math

from jrl.optim.settings import WSD_STABLE_RATIO, OptimizerSettings, SFTOptimizerSettings


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A learning-rate schedule over `total` scheduler steps: after `step` steps (0 for the first
    update) the rate is ``lr * multiplier(step)``. The multiplier rises linearly over `warmup`
    steps (step / warmup), then follows `style`:

    - ``constant``: 1;
    - ``cosine`` (verl's): max(m, (1 - m) cos(2 pi c p) / 2 + (1 + m) / 2) with m = `min_lr_ratio`,
      c = `num_cycles`, p = (step - warmup) / (total - warmup);
    - ``wsd``: `wsd_multiplier`.
    """

    lr: float
    total: int
    warmup: int
    style: str
    min_lr_ratio: float
    num_cycles: float

    @classmethod
    def from_settings(
        cls, settings: OptimizerSettings | SFTOptimizerSettings, total_steps: int
    ) -> Schedule:
        """The schedule of an optimizer's `settings` (its ``lr`` and its schedule) over
        `total_steps` scheduler steps."""
        schedule = settings.schedule
        return cls(
            lr=float(settings.lr),
            total=int(total_steps),
            warmup=schedule.warmup(total_steps),
            style=schedule.kind,
            min_lr_ratio=schedule.min_lr_ratio,
            num_cycles=schedule.num_cycles,
        )

    def multiplier(self, step: int) -> float:
        """The factor of `lr` after `step` scheduler steps."""
        if self.style == "wsd":
            return wsd_multiplier(step, self.warmup, self.total)
        if step < self.warmup:
            return step / max(1, self.warmup)
        if self.style == "constant":
            return 1.0
        m = self.min_lr_ratio
        progress = (step - self.warmup) / max(1, self.total - self.warmup)
        cosine = math.cos(math.pi * self.num_cycles * 2.0 * progress)
        return max(m, cosine * (1.0 - m) * 0.5 + (1.0 + m) * 0.5)

    def __call__(self, step: int) -> float:
        """The learning rate after `step` scheduler steps."""
        return self.lr * self.multiplier(step)


def wsd_multiplier(step: int, warmup: int, total: int) -> float:
    """verl's warmup-stable-decay factor: linear warmup, then 1 for `WSD_STABLE_RATIO` (90%) of
    the remaining steps, then a half cosine to 0."""
    if step < warmup:
        return step / max(1, warmup)
    remaining = max(0, total - warmup)
    stable = int(remaining * WSD_STABLE_RATIO)
    if step < warmup + stable:
        return 1.0
    if step >= total:
        return 0.0
    progress = (step - warmup - stable) / max(1, remaining - stable)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
