"""Decoder hyper-parameters, read from and written to a Hugging Face `config.json`.

One decoder covers several families (`model_type`). What a family fixes in the architecture lives
in `FAMILIES`; everything a `config.json` states is a field of `ModelConfig`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jrl.models.kv_layout import KVLayout

FULL, SLIDING = "full_attention", "sliding_attention"
LAYER_TYPES = (FULL, SLIDING)
ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "gelu_new")
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")
ROPE_TYPES = ("default", "linear", "llama3")
REMAT_POLICIES = ("none", "full", "dots")


@dataclasses.dataclass(frozen=True)
class Family:
    """What a model_type fixes.

    `qkv_bias` None means config.json's `attention_bias` decides; `output_bias` says whether the
    output projection has a bias whenever the q/k/v projections do. `gemma` turns on the Gemma
    numerics: RMSNorm scales applied as (1 + w), norms after attention and around the MLP, and
    embeddings multiplied by sqrt(hidden_size).
    """

    architecture: str
    default_max_positions: int
    qkv_bias: bool | None = None
    output_bias: bool = True
    qk_norm: bool = False
    gemma: bool = False


FAMILIES = {
    "llama": Family("Llama", 2048),
    "qwen2": Family("Qwen2", 32768, qkv_bias=True, output_bias=False),
    "qwen3": Family("Qwen3", 32768, qk_norm=True),
    "mistral": Family("Mistral", 131072, qkv_bias=False, output_bias=False),
    "gemma2": Family("Gemma2", 8192, gemma=True),
    "gemma3_text": Family("Gemma3", 131072, qk_norm=True, gemma=True),
}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)
ARCHITECTURE_PREFIX = {name: family.architecture for name, family in FAMILIES.items()}
DEFAULT_MAX_POSITIONS = {name: family.default_max_positions for name, family in FAMILIES.items()}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling.

    'linear' divides every rotary frequency by `factor`. 'llama3' (Llama 3.1) divides frequencies
    whose wavelength exceeds original_max_position_embeddings / low_freq_factor by `factor`, keeps
    those with wavelength below original_max_position_embeddings / high_freq_factor, and
    interpolates smoothly in between.
    """

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES[1:]:
            raise ValueError(
                f"rope_scaling type {self.rope_type!r} is not supported; use one of {ROPE_TYPES}"
            )
        if self.factor <= 0:
            raise ValueError(f"rope_scaling factor must be positive, got {self.factor}")

    @classmethod
    def from_hf(cls, params: dict[str, Any], key: str, max_positions: int) -> RopeScaling | None:
        """Reads a config.json RoPE dict (`rope_scaling` or `rope_parameters`); None for default."""
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type == "default":
            return None
        if rope_type not in ROPE_TYPES:
            raise ValueError(
                f"config.json: {key} has rope_type {rope_type!r}, which is not supported; "
                f"supported RoPE types: {', '.join(ROPE_TYPES)} (dynamic, yarn, longrope are not)"
            )
        if "factor" not in params:
            raise ValueError(f"config.json: {key} of type {rope_type!r} lacks 'factor'")
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError(f"config.json: {key}.partial_rotary_factor != 1 is not supported")
        if rope_type == "linear":
            return cls("linear", float(params["factor"]))
        return cls(
            "llama3",
            float(params["factor"]),
            float(params.get("low_freq_factor", 1.0)),
            float(params.get("high_freq_factor", 4.0)),
            int(params.get("original_max_position_embeddings") or max_positions),
        )

    def to_hf(self) -> dict[str, Any]:
        """The `rope_scaling` dict of config.json."""
        if self.rope_type == "linear":
            return {"rope_type": "linear", "factor": self.factor}
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a decoder of one of the `FAMILIES`.

    `attention_bias` puts biases on the q/k/v projections (and on the output projection where the
    family does so). `layer_types` says per layer whether attention is global (`full_attention`) or
    limited to the last `sliding_window` tokens (`sliding_attention`); None means every layer is
    sliding when `sliding_window` is set, else global. Sliding layers rotate with
    `rope_local_base_freq` when it is set (Gemma 3), global layers with `rope_theta` and
    `rope_scaling`. `query_pre_attn_scalar` (Gemma) sets the attention scale to its inverse
    square root instead of head_dim's; the soft-capping values c map scores / logits z to
    c * tanh(z / c). `attn_implementation` picks the attention kernel (see `jrl.models.attention`).
    A list `eos_token_id` is stored as a tuple so that the config stays hashable (it is static data
    of the module graph).

    Two training-memory options are not part of config.json: `remat_policy` says what each decoder
    layer keeps for the backward pass ('none': everything; 'full': only its input, recomputing the
    rest; 'dots': its input and the matmul outputs without batch dimensions), and
    `activation_offload` (with remat) keeps what remat saves (layer inputs, and with 'dots' the
    matmul outputs) in pinned host memory instead.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    attention_bias: bool
    max_position_embeddings: int
    model_type: str
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    initializer_range: float = 0.02
    hidden_act: str = "silu"
    rope_scaling: RopeScaling | None = None
    rope_local_base_freq: float | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    query_pre_attn_scalar: int | float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    attn_implementation: str = "eager"
    remat_policy: str = "none"
    activation_offload: bool = False

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {self.model_type!r} is not supported; "
                f"use one of {SUPPORTED_MODEL_TYPES}"
            )
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim <= 0 or self.head_dim % 2:
            raise ValueError(f"head_dim must be a positive even number, got {self.head_dim}")
        _check_choice("hidden_act", self.hidden_act, ACTIVATIONS)
        _check_choice("attn_implementation", self.attn_implementation, ATTN_IMPLEMENTATIONS)
        _check_choice("remat_policy", self.remat_policy, REMAT_POLICIES)
        if self.activation_offload and self.remat_policy == "none":
            raise ValueError(
                "activation_offload needs remat: set remat_policy to 'full' or 'dots' "
                "(enable_gradient_checkpointing=True)"
            )
        self._normalise_layer_types()
        for name in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive or None, got {value}")

    def _normalise_layer_types(self) -> None:
        window = self.sliding_window
        if window is not None and (not isinstance(window, int) or window <= 0):
            raise ValueError(f"sliding_window must be a positive integer or None, got {window!r}")
        types = self.layer_types
        if types is None:
            types = (SLIDING if window else FULL,) * self.num_layers
        types = tuple(types)
        if len(types) != self.num_layers or any(t not in LAYER_TYPES for t in types):
            raise ValueError(
                f"layer_types must list {self.num_layers} values out of {LAYER_TYPES}, got {types}"
            )
        if SLIDING in types and window is None:
            raise ValueError("layer_types has sliding_attention layers but sliding_window is None")
        if self.model_type == "llama" and window is not None:
            raise ValueError("llama has no sliding-window attention; set sliding_window None")
        if self.model_type == "mistral" and len(set(types)) > 1:
            raise ValueError("mistral applies sliding_window to every layer; drop layer_types")
        object.__setattr__(self, "layer_types", types)

    @property
    def family(self) -> Family:
        """The architecture traits of this model_type."""
        return FAMILIES[self.model_type]

    @property
    def output_bias(self) -> bool:
        """Whether the attention output projection has a bias."""
        return self.attention_bias and self.family.output_bias

    @property
    def kv_layout(self) -> KVLayout:
        """The KV cache's axis order for this head_dim (`jrl.models.kv_layout`)."""
        return KVLayout.for_head_dim(self.head_dim)

    @property
    def attention_scale(self) -> float:
        """The factor on q.k: query_pre_attn_scalar^-0.5 if set, else head_dim^-0.5."""
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def is_sliding(self, layer: int) -> bool:
        """Whether `layer` attends within the sliding window only."""
        return self.layer_types[layer] == SLIDING

    def layer_rope(self, layer: int) -> tuple[float, RopeScaling | None]:
        """(base frequency, scaling) of the rotary embedding in `layer`."""
        if self.is_sliding(layer) and self.rope_local_base_freq is not None:
            return self.rope_local_base_freq, None
        return self.rope_theta, self.rope_scaling

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """Builds the config from the content of a Hugging Face `config.json`."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            hint = " (for Gemma 3, give the text model's config)" if model_type == "gemma3" else ""
            raise ValueError(
                f"config.json: model_type {model_type!r} is not supported{hint}; "
                f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        family = FAMILIES[model_type]
        _check_supported_features(hf)

        def required(key: str) -> Any:
            if key not in hf:
                raise KeyError(f"config.json lacks the required key {key!r}")
            return hf[key]

        hidden, heads = int(required("hidden_size")), int(required("num_attention_heads"))
        layers = int(required("num_hidden_layers"))
        max_positions = int(hf.get("max_position_embeddings", family.default_max_positions))
        window, layer_types = _sliding_layers(hf, model_type, layers)
        gemma = family.gemma
        qkv_bias = family.qkv_bias
        return cls(
            vocab_size=int(required("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(required("intermediate_size")),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or hidden // heads),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", gemma)),
            attention_bias=bool(hf.get("attention_bias", False)) if qkv_bias is None else qkv_bias,
            max_position_embeddings=max_positions,
            model_type=model_type,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=hf.get("eos_token_id"),
            pad_token_id=hf.get("pad_token_id"),
            initializer_range=float(hf.get("initializer_range", 0.02)),
            hidden_act=_activation(hf, gemma),
            **_rope_settings(hf, model_type, max_positions),
            sliding_window=window,
            layer_types=layer_types,
            query_pre_attn_scalar=hf.get("query_pre_attn_scalar", 256) if gemma else None,
            # transformers' Gemma 3 computes but never applies attn_logit_softcapping.
            attn_logit_softcapping=_optional_float(hf.get("attn_logit_softcapping", 50.0))
            if model_type == "gemma2"
            else None,
            final_logit_softcapping=_optional_float(
                hf.get("final_logit_softcapping", 30.0 if model_type == "gemma2" else None)
            )
            if gemma
            else None,
            attn_implementation=hf.get("attn_implementation")
            or hf.get("_attn_implementation")
            or "eager",
        )

    def to_hf(self) -> dict[str, Any]:
        """The `config.json` content (without `architectures`) that transformers loads."""
        eos = list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id
        gemma = self.family.gemma
        hf: dict[str, Any] = {
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_activation" if gemma else "hidden_act": self.hidden_act,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling.to_hf() if self.rope_scaling else None,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "initializer_range": self.initializer_range,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "pad_token_id": self.pad_token_id,
        }
        if self.family.qkv_bias is None:
            hf["attention_bias"] = self.attention_bias
        if self.model_type == "llama":
            hf["mlp_bias"] = False
        hf.update(self._sliding_to_hf())
        if gemma:
            hf["query_pre_attn_scalar"] = self.query_pre_attn_scalar
            hf["attn_logit_softcapping"] = self.attn_logit_softcapping
            hf["final_logit_softcapping"] = self.final_logit_softcapping
        if self.model_type == "gemma3_text":
            hf["rope_local_base_freq"] = self.rope_local_base_freq
        return hf

    def _sliding_to_hf(self) -> dict[str, Any]:
        if self.model_type == "llama":
            return {}
        if self.model_type == "mistral":
            return {"sliding_window": self.sliding_window}
        hf = {"sliding_window": self.sliding_window, "layer_types": list(self.layer_types)}
        if self.model_type in ("qwen2", "qwen3"):
            hf["use_sliding_window"] = self.sliding_window is not None
            hf["max_window_layers"] = (
                self.layer_types.index(SLIDING) if hf["use_sliding_window"] else 0
            )
        return hf


def _check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{key} {value!r} is not supported; use one of {', '.join(choices)}")


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _activation(hf: dict[str, Any], gemma: bool) -> str:
    """The MLP activation: Gemma reads `hidden_activation` first, the others `hidden_act`."""
    if gemma:
        act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
        key = "hidden_activation"
    else:
        act, key = hf.get("hidden_act", "silu"), "hidden_act"
    if act not in ACTIVATIONS:
        raise ValueError(
            f"config.json: {key} {act!r} is not supported; use one of {', '.join(ACTIVATIONS)}"
        )
    return act


def _rope_settings(hf: dict[str, Any], model_type: str, max_positions: int) -> dict[str, Any]:
    """rope_theta, rope_scaling and rope_local_base_freq from either config.json format.

    transformers 5 writes `rope_parameters` (nested per layer type for Gemma 3); older files have
    `rope_theta`, `rope_scaling` and, for Gemma 3, `rope_local_base_freq`.
    """
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    key = "rope_scaling" if scaling else "rope_parameters"
    local: dict[str, Any] = {}
    if FULL in params or SLIDING in params:
        local = dict(params.get(SLIDING) or {})
        params = {**(params.get(FULL) or {}), **scaling}
    else:
        params = dict(scaling or params)
    gemma3 = model_type == "gemma3_text"
    theta = params.get("rope_theta") or hf.get("rope_theta") or (1e6 if gemma3 else 1e4)
    settings: dict[str, Any] = {
        "rope_theta": float(theta),
        "rope_scaling": RopeScaling.from_hf(params, key, max_positions),
    }
    if gemma3:
        if RopeScaling.from_hf(local, "rope_parameters.sliding_attention", max_positions):
            raise ValueError(
                "config.json: RoPE scaling on sliding_attention layers is not supported"
            )
        local_theta = local.get("rope_theta") or hf.get("rope_local_base_freq") or 1e4
        settings["rope_local_base_freq"] = float(local_theta)
    return settings


def _sliding_layers(
    hf: dict[str, Any], model_type: str, num_layers: int
) -> tuple[int | None, tuple[str, ...] | None]:
    """(sliding_window, layer_types) as transformers derives them for each family."""
    if model_type == "llama":
        return None, None
    if model_type == "mistral":
        return hf.get("sliding_window"), None
    if model_type in ("qwen2", "qwen3"):
        window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
        if window is None:
            return None, None
        first = int(hf.get("max_window_layers", 28))
        pattern = [SLIDING if i >= first else FULL for i in range(num_layers)]
    else:
        if hf.get("use_bidirectional_attention"):
            raise ValueError("config.json: use_bidirectional_attention=true is not supported")
        window = hf.get("sliding_window", 4096)
        every = 2 if model_type == "gemma2" else int(hf.get("sliding_window_pattern", 6))
        pattern = [SLIDING if (i + 1) % every else FULL for i in range(num_layers)]
    types = tuple(hf.get("layer_types") or pattern)
    if window is None:
        types = (FULL,) * num_layers
    return window, types


def _check_supported_features(hf: dict[str, Any]) -> None:
    """Rejects config.json settings whose behaviour this decoder does not implement."""
    if hf.get("mlp_bias"):
        raise ValueError("config.json: mlp_bias=true is not supported")
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("config.json: partial_rotary_factor != 1 is not supported")
