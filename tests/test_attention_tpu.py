"""The Pallas splash kernel (flash_attention_2 on TPU) under a mesh of several devices: run per
device inside a `shard_map` (rows over the batch axes, heads over ``tensor``, within Ulysses'
own `shard_map`), interpreted on 8 simulated CPU devices against eager attention, and a tiny
causal LM's forward and backward compiled for a real 4-chip TPU slice (libtpu, no TPU), whose
mesh (not this CPU host) decides the kernels and activation offload."""

from __future__ import annotations

import functools
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import tiny_llama

import jrl.models.attention as attention_module
from jrl.models import init_random
from jrl.models.attention import SPLASH_BLOCK, Visibility, attention
from jrl.models.decoder import layer_checkpoint_policy
from jrl.parallel import batch_sharding, make_mesh, param_shardings
from jrl.parallel.topology import libtpu_missing, open_slice

# libtpu loads even while another process holds its lockfile (no TPU is opened here).
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
ROWS, LENGTH, HEADS, KV_HEADS, HEAD_DIM = 4, SPLASH_BLOCK, 4, 2, 16


@pytest.fixture
def interpreted_splash(monkeypatch):
    """flash_attention_2 picks the splash kernel (as for a TPU mesh) and runs it in the Pallas
    interpreter; returns the list of q shapes the kernel is traced with (one device's block)."""
    shapes = []
    splash = attention_module.splash_attention

    def interpreted(q, k, v, segments, **kwargs):
        shapes.append(q.shape)
        return splash(q, k, v, segments, interpret=True, **kwargs)

    monkeypatch.setattr(attention_module, "mesh_platform", lambda: "tpu")
    monkeypatch.setattr(attention_module, "splash_attention", interpreted)
    return shapes


def _out_and_grads(q, k, v, valid, cotangent, *, implementation):
    """Attention of padded rows and the gradients of <output, cotangent> (padding rows zeroed:
    the splash kernel's differ by design and are never used)."""
    visibility = Visibility(valid, jnp.arange(LENGTH), self_attention=True)
    attend = functools.partial(attention, scale=0.3, implementation=implementation)
    out, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, visibility), q, k, v)
    keep = valid[..., None, None]
    return out * keep, vjp(cotangent * keep)


@pytest.mark.parametrize(
    ("mesh_kw", "local_q", "warns"),
    [
        ({"tensor_parallel": 2}, (1, LENGTH, 2, HEAD_DIM), False),
        ({"tensor_parallel": 4}, (2, LENGTH, 1, HEAD_DIM), False),
        ({"tensor_parallel": 8}, (ROWS, LENGTH, HEADS, HEAD_DIM), True),
        ({"sequence_parallel": 2, "tensor_parallel": 2}, (2, LENGTH, 2, HEAD_DIM), False),
    ],
    ids=["rows4-tensor2", "rows2-tensor4-kv-repeated", "tensor8-heads-whole", "ulysses2-tensor2"],
)
def test_splash_per_device_matches_eager(interpreted_splash, mesh_kw, local_q, warns):
    rng = np.random.default_rng(0)
    q = rng.normal(size=(ROWS, LENGTH, HEADS, HEAD_DIM)).astype(np.float32)
    k, v = (rng.normal(size=(ROWS, LENGTH, KV_HEADS, HEAD_DIM)).astype(np.float32) for _ in "kv")
    valid = np.arange(LENGTH)[None] >= np.array([0, 5, 0, 40])[:, None]
    valid[2, -9:] = False
    cotangent = rng.normal(size=q.shape).astype(np.float32)
    args = (q, k, v, valid, cotangent)
    expected = jax.jit(functools.partial(_out_and_grads, implementation="eager"))(*args)
    sharded = jax.jit(functools.partial(_out_and_grads, implementation="flash_attention_2"))
    with warnings.catch_warnings(record=True) as caught, jax.set_mesh(make_mesh(8, **mesh_kw)):
        warnings.simplefilter("always")
        got = sharded(*args)
    messages = [str(w.message) for w in caught if "attn_implementation" in str(w.message)]
    assert bool(messages) == warns
    assert all("do not split over the 8 'tensor' devices" in m for m in messages)
    assert set(interpreted_splash) == {local_q}  # each device ran the kernel on its own block
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5), got, expected)


needs_libtpu = pytest.mark.skipif(
    libtpu_missing() is not None, reason=f"compiling for a TPU slice: {libtpu_missing()}"
)


@needs_libtpu
@pytest.mark.parametrize(("fsdp", "sp"), [(4, 1), (2, 2)], ids=["fsdp4", "ulysses2-fsdp2"])
def test_tiny_causal_lm_with_splash_compiles_for_a_tpu_slice(fsdp, sp):
    mesh = make_mesh(4, fsdp_size=fsdp, sequence_parallel=sp, devices=open_slice("v5e:2x2").devices)
    config = tiny_llama(attn_implementation="flash_attention_2", num_layers=1, layer_types=None)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: init_random(config, dtype=jnp.bfloat16)))
    params = jax.tree.map(
        lambda p, s: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=s),
        params,
        param_shardings(params, mesh),
    )
    rows = jax.ShapeDtypeStruct((4, LENGTH), jnp.int32, sharding=batch_sharding(mesh, 2))

    def loss(params, input_ids, attention_mask):
        logits = nnx.merge(graphdef, params)(input_ids, attention_mask)
        return jnp.mean(logits * attention_mask[..., None])

    with warnings.catch_warnings(), jax.set_mesh(mesh):
        warnings.simplefilter("error", UserWarning)  # no fallback from the splash kernel
        compiled = jax.jit(jax.value_and_grad(loss)).lower(params, rows, rows).compile()
    assert "tpu_custom_call" in compiled.as_text()  # the Mosaic splash kernels ran


@needs_libtpu
def test_activation_offload_follows_the_tpu_mesh_not_the_cpu_host():
    mesh = make_mesh(4, devices=open_slice("v5e:2x2").devices)
    with warnings.catch_warnings(), jax.set_mesh(mesh):
        warnings.simplefilter("error", UserWarning)  # the CPU host's "nothing to offload"
        policy = layer_checkpoint_policy("full", activation_offload=True)
    assert policy is not jax.checkpoint_policies.nothing_saveable
