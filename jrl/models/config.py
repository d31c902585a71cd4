"""Decoder hyper-parameters, read from and written to a Hugging Face `config.json`."""

from __future__ import annotations

import dataclasses
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
ARCHITECTURE_PREFIX = {"llama": "Llama", "qwen2": "Qwen2"}
DEFAULT_MAX_POSITIONS = {"llama": 2048, "qwen2": 32768}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Llama / Qwen2 decoder.

    `attention_bias` puts biases on the q/k/v projections (always on for qwen2; for llama it also
    adds one to the output projection, as transformers does). A list `eos_token_id` is stored as a
    tuple so that the config stays hashable (it is static data of the module graph).
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

    @property
    def output_bias(self) -> bool:
        """Whether the attention output projection has a bias (llama with attention_bias only)."""
        return self.attention_bias and self.model_type == "llama"

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """Builds the config from the content of a Hugging Face `config.json`."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"config.json: model_type {model_type!r} is not supported; "
                f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        _check_supported_features(hf)

        def required(key: str) -> Any:
            if key not in hf:
                raise KeyError(f"config.json lacks the required key {key!r}")
            return hf[key]

        hidden, heads = int(required("hidden_size")), int(required("num_attention_heads"))
        return cls(
            vocab_size=int(required("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(required("intermediate_size")),
            num_layers=int(required("num_hidden_layers")),
            num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or hidden // heads),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(_rope_theta(hf)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
            max_position_embeddings=int(
                hf.get("max_position_embeddings", DEFAULT_MAX_POSITIONS[model_type])
            ),
            model_type=model_type,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=hf.get("eos_token_id"),
            pad_token_id=hf.get("pad_token_id"),
            initializer_range=float(hf.get("initializer_range", 0.02)),
        )

    def to_hf(self) -> dict[str, Any]:
        """The `config.json` content (without `architectures`) that transformers loads."""
        eos = list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id
        hf: dict[str, Any] = {
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "initializer_range": self.initializer_range,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "pad_token_id": self.pad_token_id,
        }
        if self.model_type == "llama":
            hf["attention_bias"] = self.attention_bias
            hf["mlp_bias"] = False
        else:
            hf["use_sliding_window"] = False
        return hf


def _rope_theta(hf: dict[str, Any]) -> float:
    params = hf.get("rope_parameters") or {}
    return hf.get("rope_theta") or params.get("rope_theta") or 10000.0


def _check_supported_features(hf: dict[str, Any]) -> None:
    """Rejects config.json settings whose behaviour this decoder does not implement."""
    for key in ("rope_scaling", "rope_parameters"):
        scaling = hf.get(key) or {}
        rope_type = scaling.get("rope_type", scaling.get("type"))
        if rope_type not in (None, "default"):
            raise NotImplementedError(
                f"config.json: {key} of type {rope_type!r} is not implemented; only default RoPE "
                f"(rope_scaling null) is supported"
            )
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise NotImplementedError(f"config.json: hidden_act {act!r} is not supported (only 'silu')")
    if hf.get("mlp_bias"):
        raise NotImplementedError("config.json: mlp_bias=true is not supported")
    layer_types = hf.get("layer_types") or []
    if hf.get("use_sliding_window") or any(t != "full_attention" for t in layer_types):
        raise NotImplementedError(
            "config.json: sliding-window attention is not supported (set use_sliding_window false)"
        )
