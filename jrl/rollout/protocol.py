"""What the trainer needs from a rollout engine (`jax`, `vllm`): the `Rollout` protocol."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import jax
from flax import nnx

from jrl.batch import Batch
from jrl.rollout.sampling import SamplingParams

if TYPE_CHECKING:  # the protocol names the session's type; an engine's module imports it
    from jrl.rollout.session import TurnSession


@runtime_checkable
class Rollout(Protocol):
    """An engine that samples responses to prompts with a copy of the actor's weights.

    The response layout is fixed at construction: `response_length` columns, right-padded with
    `pad_token_id`, a row ending at the first of `eos_token_ids`. `jrl.rollout.sampling_params`
    builds the `SamplingParams` that fit it from the rollout config. `isinstance(x, Rollout)`
    checks only that the members exist.
    """

    @property
    def response_length(self) -> int:
        """Columns of `responses`; `SamplingParams.max_new_tokens` may not exceed it."""
        ...

    @property
    def pad_token_id(self) -> int:
        """The token that pads responses; `SamplingParams.pad_token_id` must equal it."""
        ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The tokens that end a response (the tokenizer's and the model config's)."""
        ...

    @property
    def stats(self) -> dict[str, float]:
        """Metrics of the last `generate` call (``rollout/...`` names, floats); empty before the
        first call or where the engine reports none."""
        ...

    def generate(self, prompts: Batch, sampling: SamplingParams, key: jax.Array) -> Batch:
        """`sampling.n` responses per prompt row, rows interleaved (p0, p0, .., p1, p1, ..).

        `prompts` holds left-padded `input_ids`, `attention_mask`, `position_ids` [B, P] (and
        meta, which is repeated). The result adds `prompts` [B*n, P], `responses` and
        `response_mask` [B*n, R] (R = `response_length`), `input_ids`, `attention_mask`,
        `position_ids` [B*n, P+R], and `rollout_log_probs` [B*n, R] with
        `sampling.calculate_log_probs`. Row i's sample depends only on (key, i) and its prompt,
        not on the batch it runs in. Works whether or not `release` was called before.
        """
        ...

    def update_weights(self, params: nnx.State) -> None:
        """Generate with `params` from now on: the actor's parameter state (the structure the
        engine was built with, LoRA adapters unmerged), cast and laid out as the engine needs.
        Works whether or not `release` was called before."""
        ...

    def release(self) -> None:
        """Free what the engine holds only for generating (its KV cache; an engine that can also
        parks its weights off the device) so that training can use the memory
        (``free_cache_engine``). Calling it twice is harmless."""
        ...

    def resume(self) -> None:
        """End a `release`: make the engine ready to generate again (it may instead take its
        memory back lazily in the next `generate`). Calling it twice is harmless."""
        ...


@runtime_checkable
class TurnEngine(Rollout, Protocol):
    """A `Rollout` that keeps what a multi-turn rollout's rounds share (the JAX sampler)."""

    def generate_turn(
        self,
        prompts: Batch,
        sampling: SamplingParams,
        key: jax.Array,
        previous: Sequence[int] | None,
        *,
        stream: int = 0,
        source: int | None = None,
        drop_source: bool = False,
        row_ids: Sequence[int] | None = None,
    ) -> Batch:
        """`generate` for one round: row i continues row `previous[i]` (-1, or `previous`
        None: none) of the last round's call in stream `source` (by default `stream`; this
        call becomes `stream`'s last; `drop_source`: no later call reads `source`), whose keys
        and values the engine may reuse. Row i samples as row `row_ids[i]` (by default i) of
        `generate` would; the result is `generate`'s, only the work differs."""
        ...


@runtime_checkable
class SessionEngine(TurnEngine, Protocol):
    """A `TurnEngine` whose slots live across turns (the JAX sampler): rows join and leave
    between a few decode steps (`jrl.rollout.session`)."""

    def open_session(
        self,
        rows: int,
        prompt_width: int,
        sampling: SamplingParams,
        key: jax.Array,
        *,
        first_turn: int = 0,
        stream: int = 0,
    ) -> TurnSession:
        """A `TurnSession` for the later turns of `rows` trajectories whose first prompts are
        at most `prompt_width` tokens, continuing from the round kept as `stream` where it
        holds every row; turns count from `first_turn` (their keys)."""
        ...
