"""Streaming weight loading (onto one device or an FSDP mesh), loader errors, export of sharded
models, and the host-memory bound of loading."""

import json
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import jit_call, left_padded_inputs
from jax.sharding import PartitionSpec as P
from reference import SHAPE, torch_logits
from safetensors.numpy import load_file, save_file

from jrl.models import from_pretrained, save_pretrained, streaming
from jrl.models.safetensors_io import SafetensorsCheckpoint
from jrl.parallel import make_mesh, param_shardings

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """An untied Llama with attention biases, saved as several safetensors shards."""
    cfg = transformers.LlamaConfig(**SHAPE, attention_bias=True, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    path = tmp_path_factory.mktemp("llama")
    model.save_pretrained(path, safe_serialization=True, max_shard_size="40KB")
    assert (path / "model.safetensors.index.json").exists()
    return path, model


@pytest.fixture(scope="module")
def batch():
    return left_padded_inputs((0, 3), 8, 128, seed=0)


def _params(model):
    return {path: var.get_value() for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _layout(model, mesh):
    """The sharding that `param_shardings` gives each parameter of `model` on `mesh`."""
    shardings = param_shardings(nnx.state(model, nnx.Param), mesh)
    return {path: var.get_value() for path, var in nnx.to_flat_state(shardings)}


@pytest.fixture
def small_blocks(monkeypatch):
    """Reads and writes in blocks of 64 float32 values, so every tensor takes many blocks."""
    monkeypatch.setattr(streaming, "MIN_BLOCK_BYTES", 256)
    monkeypatch.setattr(streaming, "MAX_BLOCK_BYTES", 256)


@pytest.mark.parametrize("transposed", [False, True])
def test_read_region_assembles_blocks_from_file_and_array(small_blocks, tmp_path, transposed):
    hf = np.random.RandomState(1).randn(40, 24).astype(np.float32)
    save_file({"w": hf}, tmp_path / "model.safetensors")
    expected = hf.T if transposed else hf
    index = (slice(3, 19), slice(5, 23))
    for source in (hf, SafetensorsCheckpoint(tmp_path)["w"]):
        region = streaming.read_region(source, index, transposed, np.dtype(jnp.bfloat16))
        assert region.dtype == jnp.bfloat16
        np.testing.assert_array_equal(region, expected[index].astype(jnp.bfloat16))


def test_mesh_load_places_fsdp_shards_and_matches_single_device(small_blocks, hf_dir, batch):
    path, hf_model = hf_dir
    mesh = make_mesh(8)
    sharded, single = from_pretrained(path, mesh=mesh), from_pretrained(path)
    layout = _layout(sharded, mesh)
    for name, array in _params(sharded).items():
        assert array.sharding == layout[name], name
        assert array.ndim < 2 or "fsdp" in array.sharding.spec, name  # hidden size divides by 8
        np.testing.assert_array_equal(np.asarray(array), np.asarray(_params(single)[name]))
    logits = jit_call(sharded, batch)
    np.testing.assert_allclose(logits, jit_call(single, batch), rtol=1e-5, atol=1e-5)
    valid = batch[1].astype(bool)
    reference = torch_logits(hf_model, batch)
    np.testing.assert_allclose(logits[valid], reference[valid], rtol=1e-4, atol=1e-4)


def test_mesh_load_of_value_model_casts_and_initialises_the_head(hf_dir):
    mesh = make_mesh(8)
    kw = dict(kind="value", param_dtype=jnp.bfloat16, seed=3)
    model = from_pretrained(hf_dir[0], mesh=mesh, **kw)
    sharded, layout = _params(model), _layout(model, mesh)
    single = _params(from_pretrained(hf_dir[0], **kw))
    for name, array in sharded.items():
        assert array.dtype == jnp.bfloat16 and array.sharding == layout[name]
        np.testing.assert_array_equal(np.asarray(array), np.asarray(single[name]))
    bias, kernel = sharded[("score", "bias")], sharded[("score", "kernel")]
    assert bias.sharding.spec == P(None)  # [1] cannot be split: replicated
    assert kernel.shape == (64, 1) and kernel.sharding.spec == P("fsdp", None)
    assert 0.005 < float(np.std(np.asarray(kernel, np.float32))) < 0.05  # N(0, 0.02), not loaded


def test_external_lib_is_imported_before_loading(hf_dir, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(tmp_path)
    (tmp_path / "jrl_registry_ok.py").write_text("REGISTERED = True\n")
    from_pretrained(hf_dir[0], external_lib="jrl_registry_ok", trust_remote_code=True)
    assert sys.modules["jrl_registry_ok"].REGISTERED
    (tmp_path / "jrl_registry_broken.py").write_text("raise RuntimeError('registry failed')\n")
    with pytest.raises(ImportError, match="external_lib='jrl_registry_broken'.*registry failed"):
        from_pretrained(tmp_path / "nowhere", external_lib="jrl_registry_broken")
    with pytest.raises(ImportError, match="'jrl_registry_missing' cannot be imported.*NotFound"):
        from_pretrained(hf_dir[0], external_lib="jrl_registry_missing")


def test_path_that_is_neither_hf_folder_nor_gguf_says_what_it_found(tmp_path):
    (tmp_path / "b.txt").write_text("notes")
    (tmp_path / "a.bin").write_bytes(b"\0")
    with pytest.raises(FileNotFoundError, match="no config.json; it contains: a.bin, b.txt"):
        from_pretrained(tmp_path)
    (tmp_path / "model.pt").write_bytes(b"\0")
    with pytest.raises(ValueError, match=r"model.pt is not a .gguf file"):
        from_pretrained(tmp_path / "model.pt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="it contains: nothing"):
        from_pretrained(tmp_path / "empty")
    (tmp_path / "gguf").mkdir()
    (tmp_path / "gguf" / "tiny.gguf").write_bytes(b"\0")
    with pytest.raises(FileNotFoundError, match=r"pass its path \(.*gguf/tiny.gguf\)"):
        from_pretrained(tmp_path / "gguf")


def test_save_pretrained_of_mesh_sharded_model_loads_in_transformers(
    small_blocks, hf_dir, batch, tmp_path
):
    path, hf_model = hf_dir
    model = from_pretrained(path, mesh=make_mesh(8))
    out = tmp_path / "export"
    save_pretrained(model, out, max_shard_bytes=40_000)
    files = set(
        json.loads((out / "model.safetensors.index.json").read_text())["weight_map"].values()
    )
    assert len(files) > 1
    written = {k: v for f in sorted(files) for k, v in load_file(out / f).items()}
    original = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    assert written.keys() == original.keys()
    for name, array in written.items():
        np.testing.assert_array_equal(array, original[name], err_msg=name)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    np.testing.assert_array_equal(torch_logits(reloaded, batch), torch_logits(hf_model, batch))


def test_loading_overhead_stays_below_one_and_a_half_largest_tensors():
    cmd = [sys.executable, "bench/load_memory.py", "--size-mb", "100", "--modes", "stream,mesh"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [line["mode"] for line in lines] == ["stream", "mesh"]
    for line in lines:
        assert line["largest_tensor_bytes"] == 16 * 2**20
        assert line["model_bytes"] == line["checkpoint_bytes"] > 80 * 2**20
        assert 0 < line["peak_above_baseline_bytes"]
        assert line["transient_bytes"] < 1.5 * line["largest_tensor_bytes"], line
