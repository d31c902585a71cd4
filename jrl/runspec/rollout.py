"""The rollout's keys, read once: `rollout_spec` (``actor_rollout_ref.rollout`` of a PPO-family
config) and `generation_spec` (``rollout`` of offline generation) return the frozen `RolloutSpec`
that the engines take; `rollout_problems` lists, at load, every value the settings types refuse
(each named by its key) and the engines' cross-key rules.

verl's key paths stop here: below, the engines read typed fields only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ml_collections import ConfigDict

from jrl.config.errors import ConfigError, SettingsError
from jrl.rollout.engines import ENGINES
from jrl.rollout.limits import EngineLimits
from jrl.rollout.sampling import SamplingParams
from jrl.rollout.spec import RolloutSpec
from jrl.rollout.vllm_args import VLLM_PASS_THROUGH, VllmSettings
from jrl.runspec.models import lora_rank
from jrl.runspec.reads import KeyReads, plain

ROLLOUT = "actor_rollout_ref.rollout"
# The keys of ``val_kwargs``: validation's own sampling, the rest is the training section's.
_VALIDATION_KEYS = ("temperature", "top_k", "top_p", "do_sample", "n")
_SAMPLING_TYPES = {"temperature": float, "top_k": int, "top_p": float, "do_sample": bool}
_VLLM_SIZES = ("data_parallel_size", "pipeline_model_parallel_size", "expert_parallel_size")
# RolloutSpec's fields under their keys' names.
_SPEC_KEYS = {"tensor_parallel_size": "tensor_model_parallel_size"}


def _read(section: Any, key: str, prefix: str) -> Any:
    """`section[key]`; a missing key is an error naming it."""
    try:
        return section[key]
    except (KeyError, AttributeError, TypeError):
        raise KeyError(f"missing config key {prefix}.{key}") from None


def _given(section: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """The keys of `section` that are set (present and not null): the settings types' own
    defaults stand for the others."""
    return {key: section.get(key) for key in keys if section.get(key) is not None}


def _validation_choices(own: KeyReads) -> dict[str, Any]:
    """``val_kwargs``' temperature, top_k, top_p and do_sample. Greedy validation (do_sample
    off or temperature 0) leaves unread the keys that cannot change it: top_k and top_p, and
    whichever of do_sample and temperature the other makes moot; their values are still
    checked (peeked into the settings)."""
    keys = ("temperature", "top_k", "top_p", "do_sample")
    do_sample, temperature = own.peek("do_sample"), own.peek("temperature")
    if do_sample and temperature != 0:
        return {key: own[key] for key in keys}
    own.skip(("top_k", "top_p"), "validation is greedy (val_kwargs.do_sample or temperature)")
    values = {key: own.peek(key) for key in keys}
    if temperature != 0:  # do_sample off makes it greedy
        own.skip("temperature", "val_kwargs.do_sample is False: validation is greedy")
        values["do_sample"] = own.do_sample
    elif do_sample:  # temperature 0 makes it greedy
        own.skip("do_sample", "val_kwargs.temperature is 0: validation is greedy either way")
        values["temperature"] = own.temperature
    else:
        values["temperature"], values["do_sample"] = own.temperature, own.do_sample
    return values


def sampling_settings(
    section: Any, prefix: str, *, validate: bool = False, n: int | None = None
) -> SamplingParams:
    """The training sampling of the rollout section `section` (at `prefix`), or with `validate`
    validation's (``val_kwargs``'s temperature, top_k, top_p, do_sample and n); `n` in place of
    the section's. Token ids are left to the engine (`jrl.rollout.sampling_params`);
    ``logprobs_mode`` is read only with ``calculate_log_probs``."""
    section = KeyReads.of(section, prefix)
    own = _read(section, "val_kwargs", prefix) if validate else section
    own_prefix = f"{prefix}.val_kwargs" if validate else prefix
    try:
        if validate:
            chosen = _validation_choices(own)
        else:
            chosen = {
                key: _read(own, key, own_prefix)
                for key in ("temperature", "top_k", "top_p", "do_sample")
            }
        values = dict(
            max_new_tokens=int(_read(section, "response_length", prefix)),
            **{key: _SAMPLING_TYPES[key](value) for key, value in chosen.items()},
            n=int(_read(own, "n", own_prefix) if n is None else n),
            ignore_eos=bool(_read(section, "ignore_eos", prefix)),
            calculate_log_probs=bool(_read(section, "calculate_log_probs", prefix)),
        )
        if values["calculate_log_probs"]:
            mode = section.get("logprobs_mode")
        else:  # only checked
            section.skip("logprobs_mode", f"{prefix}.calculate_log_probs is False: no log-probs")
            mode = section.peek("logprobs_mode") if "logprobs_mode" in section else None
        if mode:
            values["logprobs_mode"] = str(mode)
        return SamplingParams(**values)
    except SettingsError as err:
        lines = [
            f"invalid sampling settings under "
            f"{own_prefix if field in _VALIDATION_KEYS else prefix}: "
            f"{err.owner}.{field}={value!r} {rule}"
            for field, value, rule in err.problems
        ]
        raise ConfigError("\n".join(lines)) from None
    except (TypeError, ValueError) as err:
        raise ConfigError(f"invalid sampling settings under {own_prefix}: {err}") from None


def _keyed(err: SettingsError, prefix: str, keys: Mapping[str, str] | None = None) -> ConfigError:
    """`err`'s problems, each named by the key its field came from (`keys`, else its own name)."""
    keys = keys or {}
    lines = [
        f"{prefix}.{keys.get(field, field)}={value!r} {rule}" for field, value, rule in err.problems
    ]
    return ConfigError("\n".join(lines))


def engine_limits(section: Any, prefix: str) -> EngineLimits:
    """The engine limits of the rollout section `section` (at `prefix`)."""
    fields = dataclasses.fields(EngineLimits)
    try:
        return EngineLimits(**{f.name: _read(section, f.name, prefix) for f in fields})
    except SettingsError as err:
        raise _keyed(err, prefix) from None


def _int_list(value: Any) -> tuple[int, ...]:
    return tuple(int(item) for item in value)


# vLLM's keys that hold numbers, with their conversion and what the value must be.
_VLLM_NUMBERS = {
    **{key: (int, "an integer") for key in ("max_model_len", *_VLLM_SIZES)},
    "cudagraph_capture_sizes": (_int_list, "a list of integers"),
}


def vllm_settings(section: Any, prefix: str) -> VllmSettings:
    """vLLM's keys of the rollout section `section` (at `prefix`); ``max_model_len`` defaults to
    prompt_length + response_length, as in verl."""
    numbers = {}
    for key, value in _given(section, tuple(_VLLM_NUMBERS)).items():
        convert, kind = _VLLM_NUMBERS[key]
        try:
            numbers[key] = convert(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{prefix}.{key}={value!r} must be {kind}") from None
    if "max_model_len" not in numbers:
        numbers["max_model_len"] = int(_read(section, "prompt_length", prefix)) + int(
            _read(section, "response_length", prefix)
        )
    extra = (section.get("engine_kwargs") or {}).get("vllm") or {}
    return VllmSettings(
        enforce_eager=bool(_read(section, "enforce_eager", prefix)),
        load_format=str(_read(section, "load_format", prefix)),
        engine_kwargs=dict(extra.whole() if isinstance(extra, KeyReads) else plain(extra)),
        **numbers,
        **_given(section, ("quantization", *VLLM_PASS_THROUGH)),
    )


def _resolve(
    section: Any,
    prefix: str,
    model: Mapping[str, Any],
    *,
    validates: bool = True,
    n: int | None = None,
) -> tuple[RolloutSpec | None, list[str]]:
    """(the `RolloutSpec` of `section`, None when a value is refused; every refusal). `model`
    holds the spec's model fields (path, trust_remote_code)."""
    problems: list[str] = []

    def attempt(build: Callable[[], Any], field: str | None = None) -> Any:
        """`build()` (a KeyReads view records its reads as going into ``rollout.<field>``), or
        None with its problems listed."""
        try:
            if field is not None and isinstance(section, KeyReads):
                return section.resolve(f"rollout.{field}", build)
            return build()
        except ConfigError as err:
            problems.extend(line for line in str(err).split("\n") if line not in problems)
            return None

    parts = dict(
        sampling=attempt(lambda: sampling_settings(section, prefix, n=n), "sampling"),
        validation=(
            attempt(lambda: sampling_settings(section, prefix, validate=True), "validation")
            if validates
            else None
        ),
        limits=attempt(lambda: engine_limits(section, prefix), "limits"),
        vllm=(
            attempt(lambda: vllm_settings(section, prefix), "vllm")
            if _read(section, "name", prefix) == "vllm"
            else None
        ),
    )
    if problems:
        return None, problems

    def spec() -> RolloutSpec:
        try:
            return RolloutSpec(
                engine=str(_read(section, "name", prefix)),
                section=prefix,
                dtype=str(_read(section, "dtype", prefix)),
                tensor_parallel_size=int(_read(section, "tensor_model_parallel_size", prefix)),
                **{key: int(seed) for key, seed in _given(section, ("seed",)).items()},
                record_routes=bool(section.get("enable_rollout_routing_replay") or False),
                expert_parallel_size=int(section.get("expert_parallel_size") or 1),
                **parts,
                **model,
            )
        except SettingsError as err:
            raise _keyed(err, prefix, _SPEC_KEYS) from None

    return attempt(spec), problems


def _trainer_rollout(config: ConfigDict) -> tuple[RolloutSpec | None, list[str]]:
    """The rollout of a PPO-family config; the actor's ``trust_remote_code`` is read for vLLM
    only (it loads the model's own code; jrl's sampler runs jrl's decoder)."""
    model, section = config.actor_rollout_ref.model, config.actor_rollout_ref.rollout
    fields = {"model_path": str(model.path)}
    if section.name == "vllm":
        fields["trust_remote_code"] = bool(model.get("trust_remote_code", False))
        fields["lora_rank"] = lora_rank(model)
    return _resolve(section, ROLLOUT, fields)


def _spec_or_error(resolved: tuple[RolloutSpec | None, list[str]]) -> RolloutSpec:
    spec, problems = resolved
    if spec is None:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(problems))
    return spec


def rollout_spec(config: ConfigDict) -> RolloutSpec:
    """The rollout of a PPO-family config (``actor_rollout_ref.rollout``, with the actor's model
    folder and trust_remote_code); ConfigError lists every refused value."""
    return _spec_or_error(_trainer_rollout(config))


def generation_spec(config: ConfigDict) -> RolloutSpec:
    """The rollout of an offline generation config (``rollout``, ``model``): ``data.n_samples``
    responses per prompt, no validation sampling."""
    model = dict(
        model_path=str(config.model.path), trust_remote_code=bool(config.model.trust_remote_code)
    )
    return _spec_or_error(
        _resolve(config.rollout, "rollout", model, validates=False, n=config.data.n_samples)
    )


def rollout_problems(config: ConfigDict) -> Iterator[str]:
    """Each rollout setting of a PPO-family config that the settings types refuse or that the
    named engine would not honour (vLLM's temperatures), with the fix."""
    yield from _trainer_rollout(config)[1]
    section = config.actor_rollout_ref.rollout
    engine = ENGINES.get(section.name)
    if engine is None or engine.temperatures is None:
        return
    low, high = engine.temperatures
    for where, validate in ((ROLLOUT, False), (f"{ROLLOUT}.val_kwargs", True)):
        try:
            sampling = sampling_settings(section, ROLLOUT, validate=validate)
        except ConfigError:  # listed above
            continue
        if not sampling.greedy and not low <= sampling.temperature <= high:
            yield (
                f"{where}.temperature={sampling.temperature} is outside what {engine.label} "
                f"samples with (0, or {low} to {high}: it raises lower temperatures to {low} and "
                "refuses higher ones); choose a temperature in that range or set "
                f"{ROLLOUT}.name=jax"
            )
