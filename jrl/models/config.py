"""Decoder hyper-parameters, read from and written to a Hugging Face `config.json`.

One decoder covers several families (`model_type`). What a family fixes in the architecture, and
how its `config.json` differs, is its entry in `jrl.models.families.FAMILIES`; everything a
`config.json` states is a field of `ModelConfig`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jrl.models.families import FAMILIES, FULL, LAYER_TYPES, SLIDING, Family, SparseBlock
from jrl.models.kv_layout import KVLayout

ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "gelu_new")
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")
ROPE_TYPES = ("default", "linear", "llama3")
REMAT_POLICIES = ("none", "full", "dots")
# How the experts' matmuls run: one grouped matmul over the tokens sorted by expert
# (`jax.lax.ragged_dot`), or every expert over every token, weighted (the reference path).
MOE_IMPLEMENTATIONS = ("ragged", "dense")


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
class Experts:
    """A mixture-of-experts decoder's sparse MLP blocks (the family's `SparseBlock` says how
    they route and are named): `num_experts` gated MLPs of `intermediate_size` each, of which a
    token uses `experts_per_token`; `norm_topk_prob` renormalises those experts' weights where
    the family reads it; `router_aux_loss_coef` weighs the load-balancing loss, which training
    adds to the loss where `output_router_logits` (as transformers adds it to a loss with
    labels); the layers in `dense_layers` keep the dense MLP (ModelConfig.intermediate_size)."""

    num_experts: int
    experts_per_token: int
    intermediate_size: int
    norm_topk_prob: bool = False
    router_aux_loss_coef: float = 0.0
    output_router_logits: bool = False
    dense_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_experts <= 0 or self.intermediate_size <= 0:
            raise ValueError(
                f"a mixture of experts needs num_experts and intermediate_size > 0, got "
                f"{self.num_experts} and {self.intermediate_size}"
            )
        if not 0 < self.experts_per_token <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok must be within 1..{self.num_experts}, got "
                f"{self.experts_per_token}"
            )
        object.__setattr__(self, "dense_layers", tuple(sorted(set(self.dense_layers))))

    @classmethod
    def from_hf(cls, hf: dict[str, Any], block: SparseBlock, layers: int) -> Experts:
        """The experts of a config.json (either spelling of the expert count)."""
        count = hf.get(block.experts_key, hf.get("num_experts", hf.get("num_local_experts")))
        dense: tuple[int, ...] = ()
        if block.dense_layers:
            step = int(hf.get("decoder_sparse_step") or 1)
            listed = set(hf.get("mlp_only_layers") or ())
            dense = tuple(i for i in range(layers) if i in listed or (i + 1) % step)
        return cls(
            num_experts=int(count or 0),
            experts_per_token=int(hf.get("num_experts_per_tok", 2)),
            intermediate_size=int(hf.get(block.expert_size_key, 0)),
            norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
            router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.0)),
            output_router_logits=bool(hf.get("output_router_logits", False)),
            dense_layers=dense,
        )

    def to_hf(self, block: SparseBlock) -> dict[str, Any]:
        """The config.json keys that say the same (dense layers as ``mlp_only_layers``)."""
        hf = {
            block.experts_key: self.num_experts,
            "num_experts_per_tok": self.experts_per_token,
            block.expert_size_key: self.intermediate_size,
            "router_aux_loss_coef": self.router_aux_loss_coef,
            "output_router_logits": self.output_router_logits,
        }
        if block.renormalize is None:
            hf["norm_topk_prob"] = self.norm_topk_prob
        if block.dense_layers:
            hf.update(decoder_sparse_step=1, mlp_only_layers=list(self.dense_layers))
        return hf


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

    A mixture-of-experts family has `experts` (None otherwise); `moe_implementation` picks how
    the experts' matmuls run (see `jrl.models.moe`).
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
    experts: Experts | None = None
    moe_implementation: str = "ragged"

    def __post_init__(self) -> None:
        if self.model_type not in FAMILIES:
            raise ValueError(
                f"model_type {self.model_type!r} is not supported; use one of {tuple(FAMILIES)}"
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
        _check_choice("moe_implementation", self.moe_implementation, MOE_IMPLEMENTATIONS)
        if (self.experts is None) != (self.family.sparse is None):
            kind = "has" if self.experts is None else "has no"
            raise ValueError(f"{self.model_type} {kind} mixture-of-experts blocks: set experts")
        if self.experts is not None and self.experts.dense_layers:
            if self.experts.dense_layers[-1] >= self.num_layers:
                raise ValueError(
                    f"experts.dense_layers {self.experts.dense_layers} name layers beyond the "
                    f"{self.num_layers} of the model"
                )
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
        problem = self.family.sliding.problem(window, types)
        if problem:
            raise ValueError(f"{self.model_type} {problem}")
        object.__setattr__(self, "layer_types", types)

    @property
    def family(self) -> Family:
        """The architecture traits of this model_type."""
        return FAMILIES[self.model_type]

    @property
    def output_bias(self) -> bool:
        """Whether the attention output projection has a bias."""
        return self.attention_bias and self.family.output_bias

    def kv_layout(self, platform: str) -> KVLayout:
        """The KV cache's axis order for this head_dim on `platform` (`jrl.models.kv_layout`)."""
        return KVLayout.for_model(self.head_dim, platform)

    @property
    def attention_scale(self) -> float:
        """The factor on q.k: query_pre_attn_scalar^-0.5 if set, else head_dim^-0.5."""
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def is_sparse(self, layer: int) -> bool:
        """Whether `layer`'s MLP is a mixture of experts."""
        return self.experts is not None and layer not in self.experts.dense_layers

    @property
    def sparse_layers(self) -> tuple[int, ...]:
        """The layers whose MLP is a mixture of experts, in order (a recorded route's layer
        axis counts these)."""
        return tuple(i for i in range(self.num_layers) if self.is_sparse(i))

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
        family = _family(model_type)
        _check_supported_features(hf, family)

        def required(key: str) -> Any:
            if key not in hf:
                raise KeyError(f"config.json lacks the required key {key!r}")
            return hf[key]

        hidden, heads = int(required("hidden_size")), int(required("num_attention_heads"))
        layers = int(required("num_hidden_layers"))
        max_positions = int(hf.get("max_position_embeddings", family.default_max_positions))
        window, layer_types = family.sliding.read(hf, layers)
        gemma = family.gemma
        qkv_bias = family.qkv_bias
        experts = None if family.sparse is None else Experts.from_hf(hf, family.sparse, layers)
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
            **_rope_settings(hf, family, max_positions),
            sliding_window=window,
            layer_types=layer_types,
            query_pre_attn_scalar=hf.get("query_pre_attn_scalar", 256) if gemma else None,
            # transformers' Gemma 3 computes but never applies attn_logit_softcapping.
            attn_logit_softcapping=_optional_float(
                hf.get("attn_logit_softcapping", family.attn_softcapping)
            )
            if family.attn_softcapping is not None
            else None,
            final_logit_softcapping=_optional_float(
                hf.get("final_logit_softcapping", family.final_softcapping)
            )
            if gemma
            else None,
            attn_implementation=hf.get("attn_implementation")
            or hf.get("_attn_implementation")
            or "eager",
            experts=experts,
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
        if self.family.writes_mlp_bias:
            hf["mlp_bias"] = False
        hf.update(self.family.sliding.write(self.sliding_window, self.layer_types))
        if gemma:
            hf["query_pre_attn_scalar"] = self.query_pre_attn_scalar
            hf["attn_logit_softcapping"] = self.attn_logit_softcapping
            hf["final_logit_softcapping"] = self.final_logit_softcapping
        if self.family.local_rope_theta is not None:
            hf["rope_local_base_freq"] = self.rope_local_base_freq
        if self.experts is not None:
            hf.update(self.experts.to_hf(self.family.sparse))
        return hf


def _family(model_type: Any) -> Family:
    """The family of a config.json's model_type; a multimodal wrapper's error names its text
    family."""
    if isinstance(model_type, str) and model_type in FAMILIES:
        return FAMILIES[model_type]
    text = [
        name for name, f in FAMILIES.items() if model_type and f.wrapper_model_type == model_type
    ]
    hint = f" (give the text model's config, model_type {text[0]!r})" if text else ""
    raise ValueError(
        f"config.json: model_type {model_type!r} is not supported{hint}; "
        f"supported model types: {', '.join(FAMILIES)}"
    )


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


def _rope_settings(hf: dict[str, Any], family: Family, max_positions: int) -> dict[str, Any]:
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
    theta = params.get("rope_theta") or hf.get("rope_theta") or family.rope_theta
    settings: dict[str, Any] = {
        "rope_theta": float(theta),
        "rope_scaling": RopeScaling.from_hf(params, key, max_positions),
    }
    if family.local_rope_theta is not None:
        if RopeScaling.from_hf(local, "rope_parameters.sliding_attention", max_positions):
            raise ValueError(
                "config.json: RoPE scaling on sliding_attention layers is not supported"
            )
        local_theta = local.get("rope_theta") or hf.get("rope_local_base_freq")
        settings["rope_local_base_freq"] = float(local_theta or family.local_rope_theta)
    return settings


def _check_supported_features(hf: dict[str, Any], family: Family) -> None:
    """Rejects config.json settings whose behaviour this decoder does not implement."""
    if hf.get("mlp_bias"):
        raise ValueError("config.json: mlp_bias=true is not supported")
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("config.json: partial_rotary_factor != 1 is not supported")
    for flag in family.refused_flags:
        if hf.get(flag):
            raise ValueError(f"config.json: {flag}=true is not supported")
