"""Peak host memory of `from_pretrained` on a random float32 Llama checkpoint (CPU).

    python bench/load_memory.py                      # ~1 GB checkpoint, all modes
    python bench/load_memory.py --size-mb 100 --modes stream

A child process writes the checkpoint tensor by tensor; then each mode loads it in a fresh child
process that measures its peak RSS (`ru_maxrss`) above the baseline taken after imports:
- `stream`: `from_pretrained(path)` onto the default CPU device;
- `mesh`: `from_pretrained(path, mesh=make_mesh(8))` over 8 simulated CPU devices;
- `naive` (baseline): the whole file read with `safetensors.numpy.load_file`, then put on device.
On CPU, device arrays live in host memory, so the loaded model counts towards RSS: `transient_*`
subtracts the model's own bytes and is what streaming bounds (goal: below 1.5x the largest tensor).
One JSON line per mode.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

MODES = ("stream", "mesh", "naive")


def _hf_config(size_bytes: int) -> dict:
    """A Llama config.json of about `size_bytes` in float32. Its largest tensors, of equal size,
    are the MLP kernels, the embedding and the untied LM head. The kernels are transposed on load
    and the last layer's are read when nearly all the model is resident, so the peak includes
    their whole transient cost."""
    hidden = 1024 if size_bytes >= 2**29 else 512
    wide = 16 * hidden
    layer_bytes = 4 * (4 * hidden * hidden + 3 * hidden * wide + 2 * hidden)
    layers = max(1, round((size_bytes - 2 * 4 * wide * hidden) / layer_bytes))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": wide,
        "hidden_size": hidden,
        "intermediate_size": wide,
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // 128,
        "num_key_value_heads": hidden // 128,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def _random(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, np.float32) * np.float32(0.02)


def generate(folder: Path, size_mb: float) -> None:
    """Writes config.json and model.safetensors (one tensor in memory at a time); prints the
    total and the largest tensor bytes as JSON."""
    from flax import nnx

    from jrl.models import CausalLM, ModelConfig
    from jrl.models.safetensors_io import write_safetensors
    from jrl.models.weights import TensorSpec, hf_tensor_specs

    hf = _hf_config(int(size_mb * 2**20))
    (folder / "config.json").write_text(json.dumps(hf, indent=2))
    config = ModelConfig.from_hf(hf)
    abstract = nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0)))
    specs = [
        TensorSpec(s.name, s.shape, s.dtype, partial(_random, s.shape, i))
        for i, s in enumerate(hf_tensor_specs(abstract))
    ]
    write_safetensors(folder, specs)
    sizes = [s.dtype.itemsize * math.prod(s.shape) for s in specs]
    print(json.dumps({"checkpoint_bytes": sum(sizes), "largest_tensor_bytes": max(sizes)}))


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _load_naive(folder: Path) -> dict:
    """Baseline: the whole checkpoint on host, then every tensor placed (kernels transposed)."""
    import jax
    from safetensors.numpy import load_file

    tensors = load_file(folder / "model.safetensors")
    placed = {
        name: jax.device_put(a.T if a.ndim == 2 and "embed" not in name else a)
        for name, a in tensors.items()
    }
    return jax.block_until_ready(placed)


def load(folder: Path, mode: str) -> None:
    """Loads the checkpoint in `mode` and prints one JSON line of memory figures."""
    import jax
    from flax import nnx

    from jrl.models import from_pretrained
    from jrl.parallel import make_mesh

    jax.devices()
    mesh = make_mesh(8) if mode == "mesh" else None
    baseline = _peak_rss_bytes()
    start = time.perf_counter()
    if mode == "naive":
        params = _load_naive(folder)
    else:
        params = jax.block_until_ready(nnx.state(from_pretrained(folder, mesh=mesh), nnx.Param))
    seconds = time.perf_counter() - start
    peak = _peak_rss_bytes()
    model_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    print(
        json.dumps(
            {
                "mode": mode,
                "baseline_rss_bytes": baseline,
                "peak_above_baseline_bytes": peak - baseline,
                "model_bytes": model_bytes,
                "transient_bytes": peak - baseline - model_bytes,
                "load_seconds": round(seconds, 2),
            }
        )
    )


def _child(*args: str, devices: int = 1) -> str:
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
    }
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(Path(__file__).resolve()), *args]
    return subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout


def run(size_mb: float, modes: list[str]) -> list[dict]:
    """Generates a checkpoint in a temporary folder and measures each mode in a fresh process."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sizes = json.loads(_child("generate", str(folder), str(size_mb)))
        for mode in modes:
            out = _child("load", str(folder), mode, devices=8 if mode == "mesh" else 1)
            line = json.loads(out.strip().splitlines()[-1])
            largest = sizes["largest_tensor_bytes"]
            line = {
                "bench": "load_memory",
                **line,
                **sizes,
                "ratio_peak_above_baseline": round(line["peak_above_baseline_bytes"] / largest, 3),
                "ratio_transient": round(line["transient_bytes"] / largest, 3),
            }
            print(json.dumps(line), flush=True)
            results.append(line)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    gen = sub.add_parser("generate")
    gen.add_argument("folder", type=Path)
    gen.add_argument("size_mb", type=float)
    child = sub.add_parser("load")
    child.add_argument("folder", type=Path)
    child.add_argument("mode", choices=MODES)
    parser.add_argument("--size-mb", type=float, default=1024)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    if args.command == "generate":
        generate(args.folder, args.size_mb)
    elif args.command == "load":
        load(args.folder, args.mode)
    else:
        run(args.size_mb, args.modes.split(","))


if __name__ == "__main__":
    main()
