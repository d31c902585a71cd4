"""Per-token log-probs (and entropy) of the responses under a causal LM, by the log-prob kernel a
role's settings name (`jrl.runspec.roles.log_prob_impl`: verl's ``use_fused_kernels`` /
``fused_kernel_options.impl_backend`` mapped onto `jrl_kernels.logprob_entropy`'s
implementations). Used by the policy roles (`LogProbForward`, the actor's loss) and by SFT.

Log-probs and entropy of response token t come from the logits at position ``-R-1+t`` divided by
the rollout temperature, here and in the sampler alike."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jrl.batch import Batch
from jrl.models import CausalLM
from jrl.models.moe import ROUTED_EXPERTS
from jrl.parallel import batch_sharding, on_mesh
from jrl.trainer.roles.specs import ForwardSpec
from jrl.trainer.update.packing import PackLayout, routed_window
from jrl_kernels import logprob_entropy

FORWARD_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")


class ResponseScores(NamedTuple):
    """What a policy's forward gives of a batch."""

    log_prob: jax.Array  # [B, R] float32
    entropy: jax.Array | None  # [B, R] float32, where asked
    routes: jax.Array | None  # [B, T, sparse layers, k]: the experts used (None: dense model)


def response_log_probs(
    model: CausalLM,
    tensors: dict[str, jax.Array],
    temperature: float,
    packing: PackLayout | None = None,
    *,
    impl: str = "naive",
    calculate_entropy: bool = True,
) -> tuple[jax.Array, jax.Array | None]:
    """Per-token log-prob and entropy [B, R] of `responses` (`response_scores`')."""
    scores = response_scores(
        model, tensors, temperature, packing, impl=impl, calculate_entropy=calculate_entropy
    )
    return scores.log_prob, scores.entropy


def response_scores(
    model: CausalLM,
    tensors: dict[str, jax.Array],
    temperature: float,
    packing: PackLayout | None = None,
    *,
    impl: str = "naive",
    calculate_entropy: bool = True,
) -> ResponseScores:
    """Per-token log-prob and entropy [B, R] of `responses` under `model` at `temperature` by
    the `jrl_kernels.logprob_entropy` implementation `impl` (entropy None unless
    `calculate_entropy`), and the experts every token used; with `packing` the model runs on
    packed rows (see `jrl.trainer.update.packing`). A mixture of experts replays the batch's
    recorded routes where it has them (`ROUTED_EXPERTS`, verl's router replay)."""
    width = tensors["responses"].shape[1]
    hidden, routes = routed_window(model.routed_hidden, tensors, width, packing)
    log_prob, entropy = logprob_entropy(
        hidden,
        model.lm_head_kernel(),
        tensors["responses"],
        temperature,
        impl=impl,
        softcap=model.config.final_logit_softcapping,
    )
    return ResponseScores(log_prob, entropy if calculate_entropy else None, routes)


class LogProbForward:
    """The jitted log-prob (and entropy) pass of a policy model (`graphdef` over parameters
    laid out as `param_shardings` on `mesh`): rows split over the batch axes in and out, the
    batch split as `forward` says, tokens scored at ``scoring.temperature`` by the kernel
    ``scoring.impl`` (a role's loss or spec)."""

    def __init__(
        self, graphdef: Any, param_shardings: Any, mesh: Mesh, forward: ForwardSpec, scoring: Any
    ):
        self.graphdef = graphdef
        self.mesh = mesh
        self.temperature = float(scoring.temperature)
        self.forward = forward
        self.impl = scoring.impl
        rows = batch_sharding(mesh, 1)  # rows split, for tensors of any rank
        # The pass as compiled; run (and lower) it under the mesh (`on_mesh`).
        self.jitted = jax.jit(
            self._forward_fn,
            static_argnums=(2, 3, 4),
            in_shardings=(param_shardings, rows),
            out_shardings=rows,
        )
        self._forward = on_mesh(self.jitted, mesh)

    def _forward_fn(self, params, tensors, packing, calculate_entropy, record_routes=False):
        model = nnx.merge(self.graphdef, params)
        scores = response_scores(
            model,
            tensors,
            self.temperature,
            packing,
            impl=self.impl,
            calculate_entropy=calculate_entropy,
        )
        return scores if record_routes else scores._replace(routes=None)

    def __call__(
        self, params: Any, batch: Batch, calculate_entropy: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Log-probs [B, R] of the batch's responses under `params` (and entropy, only computed
        when asked)."""
        scores = self.scores(params, batch, calculate_entropy)
        return scores.log_prob, scores.entropy

    def scores(
        self,
        params: Any,
        batch: Batch,
        calculate_entropy: bool = False,
        *,
        replay: bool = False,
        record_routes: bool = False,
    ) -> ResponseScores:
        """`__call__`'s log-probs and entropy, and with `record_routes` the experts each token
        used [B, T, sparse layers, k]; with `replay` the model replays the batch's
        `ROUTED_EXPERTS`."""
        keys = (*FORWARD_KEYS, *((ROUTED_EXPERTS,) if replay else ()))
        tensors = {k: np.asarray(batch.tensors[k]) for k in keys}
        return self.forward.run(
            lambda micro, layout: self._forward(
                params, micro, layout, calculate_entropy, record_routes
            ),
            tensors,
            self.mesh,
        )
