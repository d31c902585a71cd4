"""LoRA adapters as a PEFT adapter folder: ``adapter_config.json`` and
``adapter_model.safetensors``, what verl writes beside an actor checkpoint (``actor/lora_adapter``)
and what ``peft.PeftModel.from_pretrained(base, folder)`` loads onto the base model.

PEFT names a layer's adapter ``base_model.model.<layer path>.lora_A.weight`` [r, in] and
``...lora_B.weight`` [out, r]: torch's [out, in] order, so jrl's A [in, r] and B [r, out]
transposed. Its scale is ``lora_alpha / r``, as jrl's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from jrl.models.lora import linear_layers
from jrl.models.safetensors_io import write_safetensors
from jrl.models.weights import TensorSpec

ADAPTER_FOLDER = "lora_adapter"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def adapter_arrays(model: nnx.Module) -> dict[str, np.ndarray]:
    """Every adapted layer's A and B under PEFT's names, on the host. In a multi-process run each
    process gathers them (a collective: every process calls this)."""
    arrays = {}
    for path, layer in linear_layers(model).items():
        if layer.has_adapter:
            for letter, param in (("A", layer.lora_a), ("B", layer.lora_b)):
                host = multihost_utils.process_allgather(param[...], tiled=True)
                arrays[f"base_model.model.{path}.lora_{letter}.weight"] = np.asarray(host).T
    return arrays


def adapter_config(model: nnx.Module, base_model: str) -> dict[str, Any]:
    """PEFT's LoRA config of the adapters on `model` (its rank and alpha as its layers hold
    them): the adapted layers' names when every layer of those names is adapted, else their full
    paths; no dropout, no bias, PEFT's alpha / r."""
    layers = linear_layers(model)
    adapted = [path for path, layer in layers.items() if layer.has_adapter]
    if not adapted:
        raise ValueError("the model has no LoRA adapter to describe")
    first = layers[adapted[0]]
    rank = int(first.lora_a.shape[1])
    alpha = first.lora_scale * rank
    names = sorted({path.rsplit(".", 1)[-1] for path in adapted})
    named = [layer for path, layer in layers.items() if path.rsplit(".", 1)[-1] in names]
    every = all(layer.has_adapter for layer in named)
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": int(round(alpha)) if abs(alpha - round(alpha)) < 1e-9 else alpha,
        "target_modules": names if every else adapted,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
    }


def save_adapter(folder: str | os.PathLike, arrays: dict[str, np.ndarray], config: dict) -> None:
    """Writes `arrays` (`adapter_arrays`) and `config` (`adapter_config`) into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    specs = [
        TensorSpec(name, array.shape, array.dtype, lambda array=array: array)
        for name, array in arrays.items()
    ]
    write_safetensors(folder, specs, max_shard_bytes=2**62, file_name=ADAPTER_WEIGHTS)
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2), encoding="utf-8")
