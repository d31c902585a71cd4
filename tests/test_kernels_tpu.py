"""jrl_kernels.logprob_entropy compiled by the real TPU compiler (libtpu, no TPU): the Pallas TPU
kernel's forward and backward go through Mosaic on one chip and, vocabulary-parallel, on a 4-chip
slice, and `auto` picks it for a TPU mesh from this CPU host."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jrl.parallel import make_mesh
from jrl.parallel.topology import libtpu_missing, open_slice
from jrl_kernels import logprob_entropy, resolve_impl

pytestmark = pytest.mark.skipif(
    libtpu_missing() is not None, reason=f"compiling for a TPU slice: {libtpu_missing()}"
)
ROWS, DIM, VOCAB = 64, 128, 1024


def _compile(mesh, impl: str):
    """Forward + backward of sum(log p · g1 + H · g2) for `mesh`, the rows over fsdp and the LM
    head D over fsdp, V over tensor (as the trainer lays them out)."""

    def loss(h, w, t, g1, g2):
        logprob, entropy = logprob_entropy(h, w, t, 0.8, impl=impl, softcap=30.0)
        return jnp.sum(logprob * g1 + entropy * g2)

    rows = P(("data", "fsdp"))
    layout = [
        ((ROWS, DIM), jnp.bfloat16, P(("data", "fsdp"), None)),
        ((DIM, VOCAB), jnp.bfloat16, P("fsdp", "tensor")),
        ((ROWS,), jnp.int32, rows),
        ((ROWS,), jnp.float32, rows),
        ((ROWS,), jnp.float32, rows),
    ]
    args = [
        jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))
        for shape, dtype, spec in layout
    ]
    grads = (args[0].sharding, args[1].sharding)
    fn = jax.jit(jax.grad(loss, argnums=(0, 1)), out_shardings=grads)
    with jax.set_mesh(mesh):
        return fn.lower(*args).compile()


@pytest.mark.parametrize("name", ["v5e:1x1", "v5e:2x2"])
def test_pallas_tpu_forward_and_backward_compile_through_mosaic(name):
    tpu = open_slice(name)
    compiled = _compile(make_mesh(tpu.chips, devices=tpu.devices), "pallas_tpu")
    text = compiled.as_text()
    assert text.count('custom_call_target="tpu_custom_call"') >= 2  # forward and dlogits
    if tpu.chips > 1:  # vocabulary-parallel: a slice of the LM head per chip, never all of it
        assert f"[{DIM},{VOCAB // tpu.chips}]" in text
        assert f"[{DIM},{VOCAB}]" not in text and f"[{VOCAB},{DIM}]" not in text


def test_auto_picks_pallas_tpu_for_a_tpu_mesh(caplog):
    """The mesh's devices decide (this host is a CPU); the probe only lowers for the TPU."""
    tpu = open_slice("v5e:2x2")
    mesh = make_mesh(tpu.chips, devices=tpu.devices)
    chosen = []

    def fn(h):
        chosen.append(resolve_impl("auto", split_rows=True))
        return h

    shape = jax.ShapeDtypeStruct((ROWS,), jnp.float32, sharding=NamedSharding(mesh, P()))
    with caplog.at_level(logging.INFO, logger="jrl_kernels.logprob"), jax.set_mesh(mesh):
        jax.jit(fn).lower(shape)
    assert chosen == ["pallas_tpu"]
    assert any("auto is pallas_tpu" in r.getMessage() for r in caplog.records)
    assert "tpu_custom_call" in _compile(mesh, "auto").as_text()
