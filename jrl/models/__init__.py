"""Flax NNX decoders (Llama, Qwen2/3, Mistral, Gemma 2/3) with Hugging Face and GGUF weight I/O.

Names are imported on first use (`jrl.lazy`): reading one (the model config) does not build the
decoders.
"""

from jrl.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "ModelConfig": "jrl.models.config",
        "CausalLM": "jrl.models.decoder",
        "KVCache": "jrl.models.decoder",
        "RewardModel": "jrl.models.decoder",
        "ValueModel": "jrl.models.decoder",
        "default_position_ids": "jrl.models.decoder",
        "init_random": "jrl.models.decoder",
        "LoRAParam": "jrl.models.lora",
        "LoraSettings": "jrl.models.lora",
        "apply_lora": "jrl.models.lora",
        "abstract_pretrained": "jrl.models.pretrained",
        "from_pretrained": "jrl.models.pretrained",
        "gguf_to_hf_folder": "jrl.models.pretrained",
        "save_pretrained": "jrl.models.pretrained",
    },
)
