"""The model families the decoder serves, each declared by its traits (`Family`), and the ways a
family's `config.json` says which layers attend within a sliding window (`SlidingLayers`).

Adding a family is one `FAMILIES` entry (its keys are the supported `model_type`s); `ModelConfig`
asks the entry, never the family's name. This module imports no jax.
"""

from __future__ import annotations

import dataclasses
from typing import Any

FULL, SLIDING = "full_attention", "sliding_attention"
LAYER_TYPES = (FULL, SLIDING)


class SlidingLayers:
    """How a family's `config.json` states the sliding window and the layers it applies to."""

    def read(
        self, hf: dict[str, Any], num_layers: int
    ) -> tuple[int | None, tuple[str, ...] | None]:
        """(sliding_window, layer_types) as transformers derives them; None types: all alike."""
        raise NotImplementedError

    def write(self, window: int | None, types: tuple[str, ...]) -> dict[str, Any]:
        """The `config.json` keys that say the same."""
        raise NotImplementedError

    def problem(self, window: int | None, types: tuple[str, ...]) -> str | None:
        """What this convention cannot state about (window, types), or None."""
        return None


@dataclasses.dataclass(frozen=True)
class NoSlidingWindow(SlidingLayers):
    """Every layer attends globally; `config.json` has no window (Llama)."""

    def read(self, hf: dict[str, Any], num_layers: int) -> tuple[None, None]:
        return None, None

    def write(self, window: int | None, types: tuple[str, ...]) -> dict[str, Any]:
        return {}

    def problem(self, window: int | None, types: tuple[str, ...]) -> str | None:
        if window is not None:
            return "has no sliding-window attention; set sliding_window None"
        return None


@dataclasses.dataclass(frozen=True)
class EveryLayerSlides(SlidingLayers):
    """`sliding_window`, when set, limits every layer (Mistral)."""

    def read(self, hf: dict[str, Any], num_layers: int) -> tuple[int | None, None]:
        return hf.get("sliding_window"), None

    def write(self, window: int | None, types: tuple[str, ...]) -> dict[str, Any]:
        return {"sliding_window": window}

    def problem(self, window: int | None, types: tuple[str, ...]) -> str | None:
        if len(set(types)) > 1:
            return "applies sliding_window to every layer; drop layer_types"
        return None


class ListedLayers(SlidingLayers):
    """`config.json` lists `layer_types`; without the list, the family's pattern decides."""

    def pattern(self, hf: dict[str, Any], num_layers: int) -> tuple[int | None, list[str]]:
        """(sliding_window, the layer types implied when `layer_types` is absent)."""
        raise NotImplementedError

    def read(
        self, hf: dict[str, Any], num_layers: int
    ) -> tuple[int | None, tuple[str, ...] | None]:
        window, pattern = self.pattern(hf, num_layers)
        if window is None:
            return None, (FULL,) * num_layers
        return window, tuple(hf.get("layer_types") or pattern)

    def write(self, window: int | None, types: tuple[str, ...]) -> dict[str, Any]:
        return {"sliding_window": window, "layer_types": list(types)}


@dataclasses.dataclass(frozen=True)
class TopLayersSlide(ListedLayers):
    """With `use_sliding_window`, layers from `max_window_layers` up slide (Qwen2, Qwen3)."""

    default_first: int = 28

    def pattern(self, hf: dict[str, Any], num_layers: int) -> tuple[int | None, list[str]]:
        window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
        if window is None:
            return None, []
        first = int(hf.get("max_window_layers", self.default_first))
        return window, [SLIDING if i >= first else FULL for i in range(num_layers)]

    def write(self, window: int | None, types: tuple[str, ...]) -> dict[str, Any]:
        first = 0
        if window is not None:  # the first sliding layer; all of them when none slides
            first = next((i for i, kind in enumerate(types) if kind == SLIDING), len(types))
        return {
            **super().write(window, types),
            "use_sliding_window": window is not None,
            "max_window_layers": first,
        }


@dataclasses.dataclass(frozen=True)
class InterleavedSliding(ListedLayers):
    """Every `period`-th layer attends globally, the others slide (Gemma 2, Gemma 3).

    The period is read from `config.json`'s `period_key` when the family has one (Gemma 3's
    `sliding_window_pattern`), with `period` its default; the window defaults to `default_window`.
    """

    period: int
    period_key: str | None = None
    default_window: int = 4096

    def pattern(self, hf: dict[str, Any], num_layers: int) -> tuple[int | None, list[str]]:
        every = int(hf.get(self.period_key, self.period)) if self.period_key else self.period
        types = [SLIDING if (i + 1) % every else FULL for i in range(num_layers)]
        return hf.get("sliding_window", self.default_window), types


@dataclasses.dataclass(frozen=True)
class SparseBlock:
    """How a mixture-of-experts family names and routes its sparse MLP blocks.

    The block is the layer's `block` attribute (HF's module name), its router the linear map
    `router` (hidden -> experts, no bias), its experts' gated MLPs the `expert_weights` (gate,
    up, down) of HF's ``experts.{e}.<name>.weight``. A token's experts are the top k of
    softmax(router logits) in float32; their weights are renormalised to sum to 1 always
    (`renormalize` True) or as config.json's ``norm_topk_prob`` says (None), and cast back to
    the logits' dtype where `weights_in_logits_dtype`. `experts_key` and `expert_size_key` are
    config.json's expert count and per-expert FFN size; `dense_layers` reads which layers keep a
    dense MLP (Qwen3-MoE's ``mlp_only_layers`` and ``decoder_sparse_step``).
    """

    block: str
    expert_weights: tuple[str, str, str]
    experts_key: str
    expert_size_key: str
    renormalize: bool | None
    weights_in_logits_dtype: bool
    dense_layers: bool = False
    router: str = "gate"


@dataclasses.dataclass(frozen=True)
class Family:
    """What a model_type fixes, and how its `config.json` differs from the common keys.

    `gemma` turns on the Gemma numerics: RMSNorm scales applied as (1 + w), norms after attention
    and around the MLP, and embeddings multiplied by sqrt(hidden_size); its config.json names the
    activation `hidden_activation`, ties the embeddings by default and states
    `query_pre_attn_scalar` and the soft-capping values.
    """

    architecture: str  # transformers' class-name prefix: Llama -> LlamaForCausalLM
    default_max_positions: int  # max_position_embeddings where config.json omits it
    sliding: SlidingLayers  # how config.json says which layers slide
    qkv_bias: bool | None = None  # None: config.json's `attention_bias` decides
    output_bias: bool = True  # the output projection has a bias whenever q/k/v have one
    qk_norm: bool = False  # RMSNorm over each head's queries and keys
    gemma: bool = False
    attn_softcapping: float | None = None  # default attention soft-cap; None: never capped
    final_softcapping: float | None = None  # a Gemma family's default final-logit soft-cap
    rope_theta: float = 1e4  # default RoPE base
    local_rope_theta: float | None = None  # set: sliding layers have their own base (its default)
    writes_mlp_bias: bool = False  # config.json carries `mlp_bias: false`
    refused_flags: tuple[str, ...] = ()  # config.json flags whose behaviour jrl lacks
    wrapper_model_type: str | None = None  # model_type of a multimodal config.json around it
    sparse: SparseBlock | None = None  # a mixture-of-experts family's sparse MLP blocks


FAMILIES = {
    "llama": Family("Llama", 2048, NoSlidingWindow(), writes_mlp_bias=True),
    "qwen2": Family("Qwen2", 32768, TopLayersSlide(), qkv_bias=True, output_bias=False),
    "qwen3": Family("Qwen3", 32768, TopLayersSlide(), qk_norm=True),
    "mistral": Family("Mistral", 131072, EveryLayerSlides(), qkv_bias=False, output_bias=False),
    "qwen3_moe": Family(
        "Qwen3Moe",
        32768,
        NoSlidingWindow(),
        qk_norm=True,
        refused_flags=("use_sliding_window",),
        sparse=SparseBlock(
            "mlp",
            ("gate_proj", "up_proj", "down_proj"),
            experts_key="num_experts",
            expert_size_key="moe_intermediate_size",
            renormalize=None,
            weights_in_logits_dtype=True,
            dense_layers=True,
        ),
    ),
    "mixtral": Family(
        "Mixtral",
        131072,
        EveryLayerSlides(),
        qkv_bias=False,
        output_bias=False,
        rope_theta=1e6,
        sparse=SparseBlock(
            "block_sparse_moe",
            ("w1", "w3", "w2"),
            experts_key="num_local_experts",
            expert_size_key="intermediate_size",
            renormalize=True,
            weights_in_logits_dtype=False,
        ),
    ),
    "gemma2": Family(
        "Gemma2",
        8192,
        InterleavedSliding(period=2),
        attn_softcapping=50.0,
        final_softcapping=30.0,
        gemma=True,
        refused_flags=("use_bidirectional_attention",),
    ),
    "gemma3_text": Family(
        "Gemma3",
        131072,
        InterleavedSliding(period=6, period_key="sliding_window_pattern"),
        qk_norm=True,
        rope_theta=1e6,
        local_rope_theta=1e4,
        wrapper_model_type="gemma3",
        gemma=True,
        refused_flags=("use_bidirectional_attention",),
    ),
}
