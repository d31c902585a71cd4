"""jrl_kernels.logprob_entropy: every implementation (the Pallas kernels in the interpreter)
against float32 math on the full logits, values and gradients; padding; memory; lowering for the
kernels' own platforms; the choice of implementation; the vocabulary-parallel op under meshes
like the trainer's (values, gradients, no whole LM head per device)."""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jrl_kernels import logprob_entropy, resolve_impl, unavailable_reason

BF16 = jnp.bfloat16
F32 = jnp.float32

# (leading shape, D, V, hidden dtype, lm_head dtype, temperature, softcap, with padded rows)
CASES = {
    "v1031-f32-pad": ((3, 7), 32, 1031, F32, F32, 0.7, None, True),
    "v49152-bf16-softcap": ((6,), 16, 49152, BF16, F32, 1.0, 30.0, False),
    "v151936-bf16-pad": ((5,), 16, 151936, BF16, BF16, 1.3, None, True),
}
IMPLS = ("naive", "chunked", "pallas_tpu", "pallas_gpu")


def _problem(lead, dim, vocab, h_dtype, w_dtype, pad, seed=0):
    """Random hidden, lm_head, targets, mask (None without padding) and two cotangents; padded
    positions get out-of-range targets, which must not matter."""
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.standard_normal((*lead, dim)), h_dtype)
    lm_head = jnp.asarray(rng.standard_normal((dim, vocab)) / np.sqrt(dim) * 4, w_dtype)
    targets = rng.integers(0, vocab, lead)
    mask = None
    if pad:
        mask = rng.random(lead) < 0.7
        mask.flat[0] = True
        mask.flat[-1] = False
        targets = np.where(mask, targets, rng.choice([-100, vocab + 3], lead))
    cotangents = (jnp.asarray(rng.standard_normal(lead), F32) for _ in range(2))
    return hidden, lm_head, jnp.asarray(targets, jnp.int32), mask, *cotangents


def _loss_and_grads(fn, hidden, lm_head, g_logprob, g_entropy):
    """(log p, entropy, d hidden, d lm_head) of sum(log p * g_logprob + H * g_entropy)."""

    def loss(h, w):
        logprob, entropy = fn(h, w)
        return jnp.sum(logprob * g_logprob + entropy * g_entropy), (logprob, entropy)

    grads, outputs = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(hidden, lm_head)
    return (*outputs, *grads)


def _exact(hidden, lm_head, targets, temperature, softcap):
    """float32 log_softmax over the full logits, by hand (independent of jrl_kernels); the LM head
    takes the hidden dtype's values (as documented) with an exact float32 gradient."""
    rounded = lm_head + jax.lax.stop_gradient(lm_head.astype(hidden.dtype) - lm_head)
    z = jnp.dot(hidden.astype(F32), rounded.astype(F32), precision="highest")
    if softcap:
        z = softcap * jnp.tanh(z / softcap)
    log_probs = jax.nn.log_softmax(z / temperature, axis=-1)
    picked = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    return picked, -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)


def _close(got, want, tol, what):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    error = np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want))))
    assert error < tol, f"{what}: relative error {error:.3g} >= {tol}"


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", list(CASES))
def test_values_and_gradients_match_full_logits(case, impl):
    lead, dim, vocab, h_dtype, w_dtype, temperature, softcap, pad = CASES[case]
    hidden, lm_head, targets, mask, g_lp, g_ent = _problem(lead, dim, vocab, h_dtype, w_dtype, pad)
    got = _loss_and_grads(
        lambda h, w: logprob_entropy(
            h, w, targets, temperature, impl=impl, softcap=softcap, mask=mask, interpret=True
        ),
        hidden,
        lm_head,
        g_lp,
        g_ent,
    )
    keep = np.ones(lead, bool) if mask is None else mask
    # The reference sees only the kept positions: padded ones must contribute nothing.
    want = _loss_and_grads(
        lambda h, w: _exact(h, w, targets[keep], temperature, softcap),
        hidden[keep],
        lm_head,
        g_lp[keep],
        g_ent[keep],
    )
    logprob, entropy, d_hidden, d_head = got
    assert logprob.shape == entropy.shape == lead and logprob.dtype == entropy.dtype == F32
    assert d_hidden.dtype == h_dtype and d_head.dtype == w_dtype
    tol = 1e-4 if h_dtype == F32 else 2e-2
    _close(logprob[keep], want[0], 1e-4, "log-prob")
    _close(entropy[keep], want[1], 1e-4, "entropy")
    _close(d_hidden[keep], want[2], tol, "d hidden")
    _close(d_head, want[3], tol, "d lm_head")
    assert not np.any(logprob[~keep]) and not np.any(entropy[~keep])
    assert not np.any(np.asarray(d_hidden[~keep], F32)), "padded rows got a gradient"


def test_default_call_keeps_the_trainer_signature():
    """The trainer's call (positional temperature, `softcap=`, [B, R, D] hidden, default impl)."""
    hidden, lm_head, targets, _, _, _ = _problem((2, 3), 8, 50, F32, F32, False, seed=1)
    logprob, entropy = logprob_entropy(hidden, lm_head, targets, 0.5, softcap=2.0)
    want = _exact(hidden, lm_head, targets, 0.5, 2.0)
    _close(logprob, want[0], 1e-5, "log-prob")
    _close(entropy, want[1], 1e-5, "entropy")
    empty = logprob_entropy(hidden[:0], lm_head, targets[:0])
    assert [x.shape for x in empty] == [(0, 3), (0, 3)]


def _temp_bytes(impl: str, rows: int, dim: int, vocab: int) -> int:
    def loss(h, w, t):
        logprob, entropy = logprob_entropy(h, w, t, 0.9, impl=impl)
        return jnp.sum(logprob) + jnp.sum(entropy)

    shapes = (
        jax.ShapeDtypeStruct((rows, dim), BF16),
        jax.ShapeDtypeStruct((dim, vocab), F32),
        jax.ShapeDtypeStruct((rows,), jnp.int32),
    )
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*shapes).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_chunked_peak_memory_is_far_below_naive():
    naive = _temp_bytes("naive", 512, 64, 151936)
    chunked = _temp_bytes("chunked", 512, 64, 151936)
    assert naive > 512 * 151936 * 4  # at least the float32 logits
    assert chunked * 10 < naive, (chunked, naive)


@pytest.mark.parametrize(
    ("impl", "platform", "custom_call"),
    [("pallas_tpu", "tpu", "tpu_custom_call"), ("pallas_gpu", "cuda", "__gpu$xla.gpu.triton")],
)
def test_kernels_lower_for_their_platform(impl, platform, custom_call):
    """Forward and backward lower to Mosaic (TPU) / Triton (GPU) kernels, without the device."""
    # The platform check only looks at the default backend; lower through the fused op itself.
    from jrl_kernels.fused import fused_logprob_entropy
    from jrl_kernels.logprob import kernels_for

    def grads(h, w, t):
        def loss(h, w):
            logprob, entropy = fused_logprob_entropy(
                kernels_for(impl), 30.0, h, w, t, jnp.float32(0.8)
            )
            return jnp.sum(logprob) + jnp.sum(entropy)

        return jax.grad(loss, argnums=(0, 1))(h, w)

    shapes = (
        jax.ShapeDtypeStruct((300, 896), BF16),
        jax.ShapeDtypeStruct((896, 151936), F32),
        jax.ShapeDtypeStruct((300,), jnp.int32),
    )
    text = jax.jit(grads).trace(*shapes).lower(lowering_platforms=(platform,)).as_text()
    assert text.count(custom_call) >= 2  # the forward kernel and the dlogits kernel


def test_auto_picks_chunked_on_cpu_and_falls_back_with_a_logged_reason(caplog):
    from jrl_kernels.logprob import _log_once

    _log_once.cache_clear()  # each message is logged once a session; this test reads them
    with caplog.at_level(logging.INFO, logger="jrl_kernels.logprob"):
        assert resolve_impl("auto") == "chunked"
    assert any(
        "auto is chunked (no fused kernel for cpu)" in r.getMessage() for r in caplog.records
    )
    assert resolve_impl("naive") == "naive"
    # With the 8 test devices `auto` for a GPU backend keeps to chunked and says why, once.
    with caplog.at_level(logging.WARNING, logger="jrl_kernels.logprob"):
        assert resolve_impl("auto", backend="gpu") == "chunked"
        assert resolve_impl("auto", backend="gpu") == "chunked"
    warnings = [r.getMessage() for r in caplog.records if "pallas_gpu" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "8 devices" in warnings[0] and "using chunked" in warnings[0]


def test_probe_reports_a_kernel_that_cannot_run_here():
    """The probe really compiles the kernel: on a CPU only the interpreter can run Pallas."""
    assert "interpret" in unavailable_reason("pallas_gpu")
    assert "interpret" in unavailable_reason("pallas_tpu")
    assert unavailable_reason("chunked") is None


def test_probe_only_lowers_for_a_platform_this_host_cannot_run():
    """For a mesh of TPU or GPU devices seen from this CPU host the probe lowers the kernel for
    that platform (Mosaic / Triton) instead of running it; a kernel that does not lower fails."""
    assert unavailable_reason("pallas_tpu", "tpu") is None
    assert unavailable_reason("pallas_gpu", "gpu") is None
    assert "Error" in unavailable_reason("pallas_tpu", "cuda")  # Mosaic has no GPU lowering


def test_bad_arguments_fail_clearly():
    hidden, lm_head, targets, _, _, _ = _problem((4,), 8, 40, F32, F32, False)
    with pytest.raises(ValueError, match="unknown logprob_entropy impl 'fast'.*chunked"):
        logprob_entropy(hidden, lm_head, targets, impl="fast")
    with pytest.raises(ValueError, match=r"lm_head \[D, V\].*transposed"):
        logprob_entropy(hidden, lm_head.T, targets)
    with pytest.raises(ValueError, match="targets"):
        logprob_entropy(hidden, lm_head, targets[:3])
    with pytest.raises(ValueError, match="mask"):
        logprob_entropy(hidden, lm_head, targets, mask=np.ones(3, bool))
    with pytest.raises(ValueError, match="needs a GPU backend.*interpret=True"):
        logprob_entropy(hidden, lm_head, targets, impl="pallas_gpu")


def test_pallas_kernel_splits_the_rows_over_an_ambient_mesh(caplog):
    """Under `jax.set_mesh` over the 8 test devices, with a vocabulary (1031) that does not split
    over them, a Pallas kernel runs on each device's share of the tokens with the whole LM head
    (`shard_map`), saying why in a debug log: values and both gradients equal the naive
    reference's. (The GPU kernel: the TPU interpreter hangs on this path over several CPU
    devices.)"""
    impl = "pallas_gpu"
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jrl.parallel import make_mesh
    from jrl_kernels.logprob import row_split

    rng = np.random.default_rng(5)
    hidden = jnp.asarray(rng.standard_normal((8, 4, 64)), F32)
    lm_head = jnp.asarray(0.2 * rng.standard_normal((64, 1031)), F32)
    targets = jnp.asarray(rng.integers(0, 1031, (8, 4)), jnp.int32)
    mask = jnp.asarray(rng.random((8, 4)) > 0.2)
    cot = jnp.asarray(rng.standard_normal((2, 8, 4)), F32)

    def loss(impl, h, w):
        lp, ent = logprob_entropy(h, w, targets, 0.7, impl=impl, mask=mask, interpret=True)
        return jnp.sum(lp * cot[0] + ent * cot[1])

    mesh = make_mesh(8)
    rows = NamedSharding(mesh, P(("data", "fsdp")))
    with jax.set_mesh(mesh):
        assert row_split(32) == (mesh.abstract_mesh, ("data", "fsdp", "tensor", "sequence"))
        assert row_split(30) is None
    with jax.set_mesh(make_mesh(8, sequence_parallel=2)):  # data 1, fsdp 4, tensor 1, sequence 2
        assert row_split(12)[1] == ("data", "fsdp", "tensor")
        h = jax.device_put(hidden, rows)
        fn = jax.jit(jax.value_and_grad(functools.partial(loss, impl), argnums=(0, 1)))
        with caplog.at_level(logging.DEBUG, logger="jrl_kernels.logprob"):
            text = fn.lower(h, lm_head).as_text()
        got = fn(h, lm_head)
    assert "shard_map" in text or "sdy.manual_computation" in text
    assert any(
        "V=1031 does not divide over the 8 devices" in r.getMessage() for r in caplog.records
    )
    want = jax.value_and_grad(functools.partial(loss, "naive"), argnums=(0, 1))(hidden, lm_head)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-4)


# Meshes like the trainer's over the 8 test devices: (data, fsdp, tensor, sequence).
VOCAB_MESHES = {
    "fsdp8": {},
    "data2-fsdp4": {"fsdp_size": 4},
    "fsdp4-tensor2": {"tensor_parallel": 2},
}


def _trainer_layout(mesh, hidden, lm_head):
    """hidden with its rows over (data, fsdp), the LM head D over fsdp and V over tensor."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    rows = NamedSharding(mesh, P(("data", "fsdp")))
    return jax.device_put(hidden, rows), jax.device_put(
        lm_head, NamedSharding(mesh, P("fsdp", "tensor"))
    )


@pytest.mark.parametrize("impl", ["chunked", "pallas_tpu", "pallas_gpu"])
@pytest.mark.parametrize("layout", list(VOCAB_MESHES))
def test_vocab_parallel_matches_full_logits(layout, impl):
    """Under a mesh like the trainer's the fused op runs vocabulary-parallel (each device a
    slice of the LM head's columns): values and both gradients, with padding and soft-capping,
    equal the full-logits reference's (the Pallas kernels in their interpreters)."""
    from jrl.parallel import make_mesh

    lead, dim, vocab = (8, 4), 32, 1024
    hidden, lm_head, targets, mask, g_lp, g_ent = _problem(lead, dim, vocab, F32, F32, True, 3)
    mesh = make_mesh(8, **VOCAB_MESHES[layout])

    def outputs(h, w):
        return logprob_entropy(
            h, w, targets, 0.7, impl=impl, softcap=5.0, mask=mask, interpret=True
        )

    with jax.set_mesh(mesh):
        h, w = _trainer_layout(mesh, hidden, lm_head)
        text = jax.jit(outputs).lower(h, w).as_text()
        got = _loss_and_grads(outputs, h, w, g_lp, g_ent)
    assert "sdy.manual_computation" in text  # the shard_map
    keep = mask
    want = _loss_and_grads(
        lambda h, w: _exact(h, w, targets[keep], 0.7, 5.0),
        hidden[keep],
        lm_head,
        g_lp[keep],
        g_ent[keep],
    )
    logprob, entropy, d_hidden, d_head = got
    _close(logprob[keep], want[0], 1e-4, "log-prob")
    _close(entropy[keep], want[1], 1e-4, "entropy")
    _close(d_hidden[keep], want[2], 1e-4, "d hidden")
    _close(d_head, want[3], 1e-4, "d lm_head")
    assert not np.any(logprob[~keep]) and not np.any(np.asarray(d_hidden[~keep]))


def test_vocab_parallel_holds_no_whole_lm_head_per_device():
    """The compiled (per-device) program of forward + backward under an 8-device FSDP mesh has
    no buffer of the LM head's whole [D, V] shape: each device keeps V/8 columns of the head and
    of its gradient."""
    from jrl.parallel import make_mesh

    dim, vocab = 48, 1024
    hidden, lm_head, targets, _, g_lp, g_ent = _problem((64,), dim, vocab, BF16, BF16, False)
    mesh = make_mesh(8)

    def loss(h, w):
        logprob, entropy = logprob_entropy(h, w, targets, impl="chunked")
        return jnp.sum(logprob * g_lp + entropy * g_ent)

    with jax.set_mesh(mesh):
        h, w = _trainer_layout(mesh, hidden, lm_head)
        shardings = (h.sharding, w.sharding)
        fn = jax.jit(jax.grad(loss, argnums=(0, 1)), out_shardings=shardings)
        text = fn.lower(h, w).compile().as_text()
    assert f"[{dim},{vocab // 8}]" in text  # the device's slice
    whole = [shape for shape in (f"[{dim},{vocab}]", f"[{vocab},{dim}]") if shape in text]
    assert not whole, f"a whole-head buffer {whole} on a device"
