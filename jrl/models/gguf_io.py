"""GGUF (llama.cpp) import: model config from metadata and dequantized tensors under HF names."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from jrl.models.config import ModelConfig

SUPPORTED_ARCHITECTURES = ("llama",)

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_PATTERN = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_tensor_name(gguf_name: str) -> str | None:
    """HF name of a llama GGUF tensor (e.g. blk.3.attn_q.weight), or None for unknown names."""
    block = _BLOCK_PATTERN.fullmatch(gguf_name)
    if block:
        layer, part, leaf = block.groups()
        return f"model.layers.{layer}.{_BLOCK_NAMES[part]}.{leaf}" if part in _BLOCK_NAMES else None
    stem, _, leaf = gguf_name.rpartition(".")
    return f"{_GLOBAL_NAMES[stem]}.{leaf}" if stem in _GLOBAL_NAMES else None


def unpermute_rope(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's q/k row order: per head, interleaved rotary pairs back to two halves."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """The scalar and string metadata fields (arrays are read with `array_field`)."""
    return {
        key: field.contents()
        for key, field in reader.fields.items()
        if field.types and field.types[0] != gguf.GGUFValueType.ARRAY
    }


def array_field(reader: gguf.GGUFReader, key: str) -> list[Any]:
    """An array metadata field (e.g. tokenizer.ggml.tokens), or [] when absent."""
    field = reader.fields.get(key)
    return field.contents() if field is not None else []


def config_from_gguf(reader: gguf.GGUFReader, path: str | os.PathLike) -> ModelConfig:
    """ModelConfig from a llama GGUF's metadata."""
    meta = metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{path}: GGUF architecture {arch!r} is not supported; "
            f"supported: {SUPPORTED_ARCHITECTURES}"
        )

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise KeyError(f"{path}: GGUF metadata lacks {arch}.{key}")
        if isinstance(value, list):
            raise ValueError(f"{path}: per-layer {arch}.{key} values are not supported")
        return value

    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise NotImplementedError(f"{path}: RoPE scaling {scaling!r} is not implemented")
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    names = {t.name for t in reader.tensors}
    vocab = meta.get(f"{arch}.vocab_size") or len(array_field(reader, "tokenizer.ggml.tokens"))
    return ModelConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(get("attention.key_length", hidden // heads)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        max_position_embeddings=int(get("context_length")),
        model_type="llama",
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )


class GGUFCheckpoint(Mapping[str, np.ndarray]):
    """Read-only mapping from HF tensor name to a dequantized float32 array in HF layout."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"GGUF file {self.path} does not exist")
        self.reader = gguf.GGUFReader(self.path)
        self.config = config_from_gguf(self.reader, self.path)
        self._tensors = {}
        for tensor in self.reader.tensors:
            name = hf_tensor_name(tensor.name)
            if tensor.name == "rope_freqs.weight":
                raise NotImplementedError(
                    f"{self.path}: rope_freqs (Llama-3.1-style RoPE scaling) is not implemented"
                )
            if name is None:
                raise ValueError(f"{self.path}: unknown GGUF tensor {tensor.name!r}")
            self._tensors[name] = tensor

    def hf_shape(self, name: str) -> tuple[int, ...]:
        """Shape of a tensor in HF layout ([out, in] for linear weights)."""
        return tuple(int(d) for d in self._tensors[name].shape[::-1])

    def __getitem__(self, name: str) -> np.ndarray:
        tensor = self._tensors[name]
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        array = np.asarray(array, np.float32).reshape(self.hf_shape(name))
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            array = unpermute_rope(array, self.config.num_heads)
        elif name.endswith(("k_proj.weight", "k_proj.bias")):
            array = unpermute_rope(array, self.config.num_kv_heads)
        return array

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)
