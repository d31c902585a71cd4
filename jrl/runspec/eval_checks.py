"""Cross-key checks of offline generation (``python -m jrl.generate``) and evaluation
(``python -m jrl.evaluate``) configs."""

from __future__ import annotations

from collections.abc import Iterator

from ml_collections import ConfigDict

from jrl.config.errors import ConfigError
from jrl.rollout.engines import ENGINES
from jrl.runspec.validate import TRUNCATIONS


def _generation_problems(config: ConfigDict) -> Iterator[str]:
    rollout, data = config.rollout, config.data
    if rollout.name not in ENGINES:
        yield f"rollout.name={rollout.name!r} is not one of {', '.join(ENGINES)}"
    if data.truncation not in TRUNCATIONS:
        yield f"data.truncation={data.truncation!r} is not one of {', '.join(TRUNCATIONS)}"
    if rollout.n != 1:
        yield (
            f"rollout.n={rollout.n}: responses per prompt are set by data.n_samples; "
            "keep rollout.n=1"
        )
    if data.n_samples < 1 or data.batch_size < 1:
        yield f"data.n_samples={data.n_samples} and data.batch_size={data.batch_size} must be >= 1"
    if data.n_samples > 1 and (rollout.temperature == 0 or not rollout.do_sample):
        yield (
            f"data.n_samples={data.n_samples} with greedy decoding (rollout.temperature="
            f"{rollout.temperature}, rollout.do_sample={rollout.do_sample}) gives identical "
            "responses; set data.n_samples=1 or sample (temperature > 0, do_sample=true)"
        )
    if rollout.prompt_length < 1 or rollout.response_length < 1:
        yield "rollout.prompt_length and rollout.response_length must be >= 1"
    if config.trainer.nnodes * config.trainer.n_gpus_per_node <= 0:
        yield "trainer.nnodes * trainer.n_gpus_per_node must be positive"


def validate_generation(config: ConfigDict) -> None:
    """Raise ConfigError listing every broken generation rule."""
    problems = list(_generation_problems(config))
    if problems:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(problems))


def validate_evaluation(config: ConfigDict) -> None:
    """Raise ConfigError when ``pass_at_k.k`` holds anything but positive integers."""
    ks = config.pass_at_k.k
    if ks is not None and not all(isinstance(k, int) and k > 0 for k in ks):
        raise ConfigError(f"pass_at_k.k={ks!r} must be a list of positive integers (or null)")
