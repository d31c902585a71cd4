"""Flax NNX decoders (Llama, Qwen2/3, Mistral, Gemma 2/3) with Hugging Face and GGUF weight I/O."""

from jrl.models.config import ModelConfig
from jrl.models.decoder import (
    CausalLM,
    KVCache,
    RewardModel,
    ValueModel,
    default_position_ids,
    init_random,
)
from jrl.models.lora import LoRAParam, LoraSettings, apply_lora
from jrl.models.pretrained import (
    abstract_pretrained,
    from_pretrained,
    gguf_to_hf_folder,
    save_pretrained,
)

__all__ = [
    "CausalLM",
    "KVCache",
    "LoRAParam",
    "LoraSettings",
    "ModelConfig",
    "RewardModel",
    "ValueModel",
    "apply_lora",
    "default_position_ids",
    "abstract_pretrained",
    "from_pretrained",
    "gguf_to_hf_folder",
    "init_random",
    "save_pretrained",
]
