"""Each model family is declared by its traits (`jrl.models.families`): how its config.json states
the sliding window, its defaults, and that a new family is one `FAMILIES` entry."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import reference

from jrl.models.config import ModelConfig
from jrl.models.families import FAMILIES, Family, TopLayersSlide

# six layers (a Gemma 3 period), max_position_embeddings left to each family's default
SHAPE = {
    **{k: v for k, v in reference.SHAPE.items() if k != "max_position_embeddings"},
    "num_hidden_layers": 6,
}
F, S = "F", "S"
TYPES = {F: "full_attention", S: "sliding_attention"}
QWEN_WINDOW = {"use_sliding_window": True, "sliding_window": 8}


@pytest.mark.parametrize(
    "model_type, given, window, layers, written",
    [
        ("llama", {"sliding_window": 8}, None, "FFFFFF", {"mlp_bias": False}),
        ("mistral", {"sliding_window": 8}, 8, "SSSSSS", {"sliding_window": 8}),
        ("mistral", {}, None, "FFFFFF", {"sliding_window": None}),
        ("qwen2", {"sliding_window": 8}, None, "FFFFFF", {"use_sliding_window": False}),
        (
            "qwen2",
            {**QWEN_WINDOW, "max_window_layers": 2},
            8,
            "FFSSSS",
            {"use_sliding_window": True, "max_window_layers": 2},
        ),
        ("qwen3", QWEN_WINDOW, 8, "FFFFFF", {"max_window_layers": 6}),  # default: from 28 up
        ("gemma2", {}, 4096, "SFSFSF", {"sliding_window": 4096}),
        ("gemma2", {"sliding_window": None}, None, "FFFFFF", {"sliding_window": None}),
        ("gemma3_text", {"sliding_window": 8}, 8, "SSSSSF", {"sliding_window": 8}),
        ("gemma3_text", {"sliding_window_pattern": 3}, 4096, "SSFSSF", {}),
        (
            "gemma3_text",
            {"layer_types": [TYPES[t] for t in "FSFSSS"]},
            4096,
            "FSFSSS",
            {"layer_types": [TYPES[t] for t in "FSFSSS"]},
        ),
    ],
)
def test_each_family_reads_and_writes_its_sliding_window(
    model_type, given, window, layers, written
):
    """The sliding window and the layers it applies to, as transformers derives them from each
    family's config.json, and written back in the same family's terms."""
    config = ModelConfig.from_hf({**SHAPE, "model_type": model_type, **given})
    assert config.sliding_window == window
    assert config.layer_types == tuple(TYPES[t] for t in layers)
    hf = config.to_hf()
    assert {key: hf[key] for key in written} == written
    assert ModelConfig.from_hf(hf) == config


@pytest.mark.parametrize(
    "model_type, change, match",
    [
        ("llama", {"sliding_window": 8}, "llama has no sliding-window attention"),
        (
            "mistral",
            {"sliding_window": 8, "layer_types": tuple(TYPES[t] for t in "FSSSSS")},
            "mistral applies sliding_window to every layer",
        ),
    ],
)
def test_a_family_refuses_windows_its_config_cannot_state(model_type, change, match):
    config = ModelConfig.from_hf({**SHAPE, "model_type": model_type})
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(config, **change)


@pytest.mark.parametrize(
    "model_type, attn, final, theta, local_theta",
    [
        ("llama", None, None, 1e4, None),
        ("qwen2", None, None, 1e4, None),
        ("gemma2", 50.0, 30.0, 1e4, None),
        ("gemma3_text", None, None, 1e6, 1e4),
    ],
)
def test_family_defaults(model_type, attn, final, theta, local_theta):
    """What each family assumes where config.json is silent: soft-caps and RoPE bases."""
    config = ModelConfig.from_hf({**SHAPE, "model_type": model_type})
    assert config.attn_logit_softcapping == attn
    assert config.final_logit_softcapping == final
    assert config.rope_theta == theta
    assert config.rope_local_base_freq == local_theta
    assert ("rope_local_base_freq" in config.to_hf()) == (local_theta is not None)


def test_a_new_family_is_one_entry(monkeypatch):
    toy = Family("Toy", 4096, TopLayersSlide(), qk_norm=True, rope_theta=5e5, writes_mlp_bias=True)
    monkeypatch.setitem(FAMILIES, "toy", toy)
    config = ModelConfig.from_hf({**SHAPE, "model_type": "toy", **QWEN_WINDOW})
    assert config.family is toy and config.rope_theta == 5e5
    assert config.max_position_embeddings == 4096 and config.sliding_window == 8
    hf = config.to_hf()
    assert hf["mlp_bias"] is False and hf["use_sliding_window"] is True
    assert ModelConfig.from_hf(hf) == config
    with pytest.raises(ValueError, match="supported model types: .*, toy"):
        ModelConfig.from_hf({**SHAPE, "model_type": "gpt2"})


def test_the_family_table_imports_no_jax():
    """`jrl.models.config` and `jrl.models.families` are plain data: the resolver reads their
    name lists without jax. (The probe skips `jrl/models/__init__`, which builds the decoder.)"""
    probe = (
        "import sys, types; package = types.ModuleType('jrl.models'); "
        "package.__path__ = ['jrl/models']; sys.modules['jrl.models'] = package; "
        "import jrl.models.config; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax', 'numpy')))"
    )
    root = __file__.rsplit("/tests/", 1)[0]
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=root
    )
    assert out.stdout.strip() == "[]"
