"""Multi-process SPMD: joining a run of several JAX processes, and moving host data between the
per-process and the global view.

A run of P processes is one program: every process executes the same steps on its own devices,
and arrays sharded over the global mesh span them all. How a process learns that it is part of a
run (`launch_from_env`), first match wins:

- ``JRL_DISTRIBUTED=off``: never (one process, or a runtime someone else started);
- ``JRL_COORDINATOR_ADDRESS`` (host:port of process 0), ``JRL_NUM_PROCESSES``,
  ``JRL_PROCESS_ID`` (JAX's own ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``,
  ``JAX_PROCESS_ID`` are read as well);
- SLURM (``SLURM_NTASKS`` > 1) or Open MPI (``OMPI_COMM_WORLD_SIZE`` > 1): JAX reads the
  coordinator, count and rank from the scheduler's variables (``JAX_COORDINATOR_PORT`` picks the
  port). With one task per node a process drives all of its ``CUDA_VISIBLE_DEVICES``; with
  several, JAX gives each task one GPU (its local rank);
- a Cloud TPU VM, or ``JRL_DISTRIBUTED=auto``: JAX's own cluster detection (TPU metadata,
  Kubernetes, ...);
- otherwise the process runs alone and `jax.distributed` is not started.

The trainer keeps a global host view: each process loads its share of the prompts
(`gather_batch` assembles the batch), arrays go to the devices sharded over the whole mesh, and
results that the host needs whole come back with `host_array` / `host_batch`. Rewards are scored
by each process on its own rows and combined (`score_per_process`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import pickle
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jrl.batch import Batch

_ADDRESS = ("JRL_COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS")
_COUNT = ("JRL_NUM_PROCESSES", "JAX_NUM_PROCESSES")
_ID = ("JRL_PROCESS_ID", "JAX_PROCESS_ID")
_SCHEDULERS = (("slurm", "SLURM_NTASKS"), ("openmpi", "OMPI_COMM_WORLD_SIZE"))
_TPU_DEVICE_FILES = ("/dev/accel0", "/dev/vfio/0")
_THREAD = threading.local()  # `exchange_on`: the devices a thread's host exchanges run on


@dataclasses.dataclass(frozen=True)
class Launch:
    """How this process joins a multi-process run. `source` says where the settings come from
    (``env``, ``slurm``, ``openmpi``, ``tpu``, ``auto``); fields left None are found by JAX."""

    source: str
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        if env.get(name):
            return name, env[name]
    return None


def _integer(found: tuple[str, str]) -> int:
    name, text = found
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"${name}={text!r} must be an integer") from None


def _tasks_on_node(env: Mapping[str, str]) -> int | None:
    """How many tasks of the job share this node, when Open MPI or SLURM says."""
    if env.get("OMPI_COMM_WORLD_LOCAL_SIZE"):
        return _integer(("OMPI_COMM_WORLD_LOCAL_SIZE", env["OMPI_COMM_WORLD_LOCAL_SIZE"]))
    nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES")
    if not nodes:
        return None
    return _integer(("SLURM_NTASKS", env["SLURM_NTASKS"])) // _integer(("SLURM_NNODES", nodes))


def _whole_node_gpus(env: Mapping[str, str]) -> tuple[int, ...] | None:
    """All the visible GPUs when this is the node's only task (JAX would give it just one)."""
    visible = env.get("CUDA_VISIBLE_DEVICES", "").split(",")
    if _tasks_on_node(env) != 1 or not all(v.strip().isdigit() for v in visible):
        return None
    return tuple(range(len(visible)))


def _on_tpu_vm() -> bool:
    has_libtpu = importlib.util.find_spec("libtpu") is not None
    return has_libtpu and any(Path(p).exists() for p in _TPU_DEVICE_FILES)


def launch_from_env(env: Mapping[str, str] | None = None) -> Launch | None:
    """The multi-process settings the environment describes, or None for a single process
    (see the module docstring for the variables and their order)."""
    env = os.environ if env is None else env
    mode = env.get("JRL_DISTRIBUTED", "").lower()
    if mode in ("off", "0", "false"):
        return None
    count, rank = _first(env, _COUNT), _first(env, _ID)
    if count or rank:
        address = _first(env, _ADDRESS)
        missing = [
            names[0] for names, v in ((_ADDRESS, address), (_COUNT, count), (_ID, rank)) if not v
        ]
        if missing:
            raise ValueError(
                f"a multi-process run needs {', '.join(missing)} as well (set all of "
                "JRL_COORDINATOR_ADDRESS=host:port of process 0, JRL_NUM_PROCESSES and "
                "JRL_PROCESS_ID, or none)"
            )
        processes, process_id = _integer(count), _integer(rank)
        if not 0 <= process_id < processes:
            raise ValueError(f"${rank[0]}={process_id} must be in [0, ${count[0]}={processes})")
        if processes == 1:
            return None
        return Launch("env", address[1], processes, process_id, _whole_node_gpus(env))
    for source, variable in _SCHEDULERS:
        if env.get(variable) and _integer((variable, env[variable])) > 1:
            return Launch(source, local_device_ids=_whole_node_gpus(env))
    if mode == "auto":
        return Launch("auto")
    return Launch("tpu") if _on_tpu_vm() else None


def initialize(timeout_s: int, env: Mapping[str, str] | None = None) -> Launch | None:
    """Starts `jax.distributed` when the environment describes a multi-process run (before
    anything touches JAX's devices); waits up to `timeout_s` for every process to join.
    Returns the settings used (None: a single process)."""
    launch = launch_from_env(env)
    if launch is None or jax.distributed.is_initialized():
        return launch
    jax.distributed.initialize(
        coordinator_address=launch.coordinator_address,
        num_processes=launch.num_processes,
        process_id=launch.process_id,
        local_device_ids=None if launch.local_device_ids is None else list(launch.local_device_ids),
        initialization_timeout=int(timeout_s),
    )
    return launch


def is_primary() -> bool:
    """Whether this is process 0, the one that prints, logs and writes shared files."""
    return jax.process_index() == 0


def start(nnodes: int, n_gpus_per_node: int, timeout_s: int) -> Launch | None:
    """What a command does first in a run that may span processes: `initialize` (waiting up to
    `timeout_s` for the others), `quiet_unless_primary`, `check_topology`."""
    launch = initialize(timeout_s)
    quiet_unless_primary()
    check_topology(nnodes, n_gpus_per_node)
    return launch


def quiet_unless_primary() -> None:
    """On processes other than 0: standard output (Python's and native libraries') and progress
    bars off; errors and warnings still reach standard error."""
    if is_primary():
        return
    sys.stdout.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    os.environ["TQDM_DISABLE"] = "1"


def check_topology(nnodes: int, n_gpus_per_node: int) -> None:
    """In a multi-process run, ``trainer.nnodes * trainer.n_gpus_per_node`` must be every
    device of every process, and a node must hold whole processes."""
    processes = jax.process_count()
    if processes == 1:
        return
    total, local = jax.device_count(), jax.local_device_count()
    seen = f"JAX sees {processes} processes with {local} devices each ({total} in all)"
    if nnodes * n_gpus_per_node != total:
        raise ValueError(
            f"trainer.nnodes * trainer.n_gpus_per_node = {nnodes}*{n_gpus_per_node} = "
            f"{nnodes * n_gpus_per_node} devices, but {seen}; set trainer.nnodes={processes} "
            f"and trainer.n_gpus_per_node={local}"
        )
    if n_gpus_per_node % local:
        raise ValueError(
            f"trainer.n_gpus_per_node={n_gpus_per_node} is not a multiple of the {local} devices "
            f"of one process ({seen}); set trainer.nnodes={processes} and "
            f"trainer.n_gpus_per_node={local}"
        )


def exchange_on(devices: Sequence[jax.Device] | None) -> None:
    """Runs this thread's host exchanges between processes (`barrier`, `any_process`,
    `allgather_objects`, `shared_token`) on `devices` (one of each process's) instead of every
    device. A split run's trainer and rollout threads each exchange on their own devices, so
    neither thread's exchanges wait behind the other's programs (None: every device)."""
    _THREAD.devices = None if devices is None else tuple(devices)


def threads_overlap(devices: Sequence[jax.Device]) -> bool:
    """Whether a thread of programs on `devices` may run beside this thread's. Not on several
    CPU processes: XLA:CPU's collectives between processes (gloo) mix up two threads'
    collectives between the same processes, so there the two must take turns."""
    return not (jax.process_count() > 1 and devices[0].platform == "cpu")


@functools.cache
def _exchange(devices: tuple[jax.Device, ...]) -> tuple[jax.Device, NamedSharding, Any]:
    """For `exchange_on`'s `devices`: this process's device among the first of each process,
    their [processes, ...] layout and the program that replicates it on each of them."""
    first: dict[int, jax.Device] = {}
    for device in devices:
        first.setdefault(device.process_index, device)
    mesh = Mesh(np.asarray([first[p] for p in sorted(first)]), ("processes",))
    whole = jax.jit(lambda a: a, out_shardings=NamedSharding(mesh, PartitionSpec()))
    return first[jax.process_index()], NamedSharding(mesh, PartitionSpec("processes")), whole


def _gathered(x: np.ndarray) -> np.ndarray:
    """[processes, ...]: every process's `x` (same shape and dtype everywhere)."""
    devices = getattr(_THREAD, "devices", None)
    if devices is None:
        return np.asarray(multihost_utils.process_allgather(x))
    local, stacked, whole = _exchange(devices)
    x = np.asarray(x)
    mine = jax.device_put(x[None], local)
    shape = (stacked.mesh.size, *x.shape)
    gathered = whole(jax.make_array_from_single_device_arrays(shape, stacked, [mine]))
    return np.asarray(gathered.addressable_data(0))


def barrier(name: str) -> None:
    """Waits until every process reaches the barrier called `name`."""
    if jax.process_count() == 1:
        return
    if getattr(_THREAD, "devices", None) is None:
        multihost_utils.sync_global_devices(name)
    else:
        _gathered(np.int32(0))


def any_process(flag: bool) -> bool:
    """Whether `flag` holds on any process; every process calls it and gets the same answer."""
    if jax.process_count() == 1:
        return bool(flag)
    return bool(np.any(_gathered(np.bool_(flag))))


def agreed_minimum(value: int | None) -> int | None:
    """The smallest of every process's `value` (None when any process has none), the same on
    every process: what sizes compiled programs must agree on."""
    values = allgather_objects(value)
    return None if any(v is None for v in values) else min(values)


def process_rows(rows: int) -> slice:
    """This process's share of `rows` rows, as `jrl.data.DataLoader` splits a batch:
    ``[p * rows // P, (p + 1) * rows // P)``."""
    p, count = jax.process_index(), jax.process_count()
    return slice(p * rows // count, (p + 1) * rows // count)


def put_global(x: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    """Host array `x`, the same on every process, laid out with `sharding`: each process copies
    only the pieces that its own devices hold."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def host_array(x: Any) -> np.ndarray:
    """`x` whole on the host. An array sharded over several processes is gathered from all of
    them: a collective, so every process must call it."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def host_batch(batch: Batch) -> Batch:
    """A copy of `batch` with every tensor whole on the host (`host_array`)."""
    return Batch({k: host_array(v) for k, v in batch.tensors.items()}, dict(batch.meta))


def allgather_objects(obj: Any) -> list[Any]:
    """Every process's `obj` (any picklable value), in process order."""
    if jax.process_count() == 1:
        return [obj]
    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    sizes = _gathered(np.int64(data.size))
    # a power-of-two buffer keeps the number of compiled gathers small
    padded = np.zeros(1 << int(sizes.max() - 1).bit_length(), np.uint8)
    padded[: data.size] = data
    everything = _gathered(padded)
    return [pickle.loads(row[:size].tobytes()) for row, size in zip(everything, sizes, strict=True)]


def gather_batch(local: Batch) -> Batch:
    """The global batch from each process's rows (process 0's first); `local` itself when there
    is one process."""
    if jax.process_count() == 1:
        return local
    return Batch.concat([part for part in allgather_objects(local.to_numpy()) if len(part)])


def score_per_process(reward_fn: Callable[..., dict[str, Any]], batch: Batch) -> dict[str, Any]:
    """``reward_fn(batch, return_dict=True)`` with each process scoring only its own rows
    (`process_rows`), the results combined in row order on every process."""
    if jax.process_count() == 1:
        return reward_fn(batch, return_dict=True)
    mine = batch.take(np.arange(len(batch))[process_rows(len(batch))])
    scored = reward_fn(mine, return_dict=True) if len(mine) else None
    parts = [part for part in allgather_objects(scored) if part is not None]
    keys = dict.fromkeys(k for part in parts for k in part["reward_extra_info"])
    return {
        "reward_tensor": np.concatenate([np.asarray(part["reward_tensor"]) for part in parts]),
        "reward_extra_info": {k: [v for part in parts for v in _column(part, k)] for k in keys},
    }


def _column(scored: dict[str, Any], key: str) -> list[Any]:
    """One `reward_extra_info` column of a process's result (None per row where it lacks it)."""
    rows = len(scored["reward_tensor"])
    return list(scored["reward_extra_info"].get(key, [None] * rows))


def shared_token() -> str:
    """A random hex token, the same on every process (process 0's)."""
    token = np.frombuffer(os.urandom(4), np.uint8)
    if jax.process_count() > 1:
        token = _gathered(token)[0]
    return bytes(np.asarray(token, np.uint8)).hex()
