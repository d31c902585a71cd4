"""config.json of public model shapes (no weights), for planning their runs with jrl.compile.

The values are the models' published Hugging Face configurations (the fields jrl's decoder
reads). ``python bench/model_shapes.py NAME FOLDER`` writes FOLDER/config.json and prints FOLDER.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

_QWEN = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}
_LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "rms_norm_eps": 1e-5,
    "vocab_size": 128256,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def _shape(base: dict, hidden: int, mlp: int, layers: int, heads: int, kv: int, **extra) -> dict:
    return {
        **base,
        "hidden_size": hidden,
        "intermediate_size": mlp,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        **extra,
    }


SHAPES = {
    "qwen2.5-0.5b": _shape(
        _QWEN, 896, 4864, 24, 14, 2, vocab_size=151936, tie_word_embeddings=True
    ),
    "qwen2.5-1.5b": _shape(
        _QWEN, 1536, 8960, 28, 12, 2, vocab_size=151936, tie_word_embeddings=True
    ),
    "qwen2.5-7b": _shape(
        _QWEN, 3584, 18944, 28, 28, 4, vocab_size=152064, tie_word_embeddings=False
    ),
    "qwen2.5-32b": _shape(
        _QWEN,
        5120,
        27648,
        64,
        40,
        8,
        vocab_size=152064,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
    ),
    "llama-3.1-8b": _shape(_LLAMA, 4096, 14336, 32, 32, 8),
    "llama-3.1-70b": _shape(_LLAMA, 8192, 28672, 80, 64, 8),
    # Mixtures of experts: 8 of 128 experts of 768 per token (Qwen3-30B-A3B), 2 of 8 of 14336
    # (Mixtral-8x7B-v0.1)
    "qwen3-30b-a3b": _shape(
        {**_QWEN, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]},
        2048,
        6144,
        48,
        32,
        4,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        router_aux_loss_coef=0.001,
    ),
    "mixtral-8x7b": _shape(
        {
            **_LLAMA,
            "model_type": "mixtral",
            "architectures": ["MixtralForCausalLM"],
            "max_position_embeddings": 32768,
            "rope_theta": 1000000.0,
            "rope_scaling": None,
            "vocab_size": 32000,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        4096,
        14336,
        32,
        32,
        8,
        num_local_experts=8,
        num_experts_per_tok=2,
        router_aux_loss_coef=0.02,
        sliding_window=None,
    ),
    # configs/gsm8k_ppo.py's model (the document's): deepseek-ai/deepseek-llm-7b-chat
    "deepseek-llm-7b-chat": _shape(
        {
            **_LLAMA,
            "max_position_embeddings": 4096,
            "rope_theta": 10000.0,
            "rope_scaling": None,
            "rms_norm_eps": 1e-6,
            "vocab_size": 102400,
            "bos_token_id": 100000,
            "eos_token_id": 100001,
        },
        4096,
        11008,
        30,
        32,
        32,
    ),
}


def write_shape(name: str, folder: str | Path) -> Path:
    """FOLDER/config.json of model shape `name` (one of `SHAPES`); returns FOLDER."""
    if name not in SHAPES:
        raise SystemExit(f"unknown model shape {name!r}; known: {', '.join(SHAPES)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "config.json.tmp"
    tmp.write_text(json.dumps(SHAPES[name], indent=2))
    tmp.replace(folder / "config.json")
    return folder


if __name__ == "__main__":
    print(write_shape(sys.argv[1], sys.argv[2]))
