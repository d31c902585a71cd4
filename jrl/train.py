"""``python -m jrl.train``: PPO-family training (GAE/PPO, GRPO, ...) from a config file.

Usage::

    python -m jrl.train --config=configs/gsm8k_grpo.py:tiny [overrides ...]

Overrides use verl's ``a.b.c=value`` form or ``--config.a.b.c=value``; values parse as in Hydra
(numbers, true/false, null, lists such as ``trainer.logger=['console','tensorboard']``).

Config files: ``configs/gsm8k_ppo.py`` (PPO with a GAE critic) and ``configs/gsm8k_grpo.py`` (GRPO);
presets ``:tiny`` (tiny random model, for smoke runs) and ``:quickstart`` (SmolLM2-135M-Instruct on
CPU). ``configs/word_problems_grpo.py`` (and ``_ppo``) is a CPU run in which SmolLM2 learns; its
``:quickstart`` takes under 10 minutes on 2 cores. Assets are built on first use under
``~/.cache/jrl`` (``$JRL_CACHE``). A run that validated at least twice ends with one line: the first
and last validation score, the steps and time between, and the validation plot. The resolved
config is printed at start-up; metrics print once per step as ``step:N - name:value - ...``.
Loggers: ``trainer.logger`` takes console, file, tensorboard, wandb (offline without an API key),
mlflow (a file store under the run directory unless ``MLFLOW_TRACKING_URI`` is set) and swanlab.
Every step's metrics are also appended to ``<default_local_dir>/metrics.jsonl``; at the end of a
run PNG plots of reward, response length, KL, entropy and validation scores are written to
``<default_local_dir>/plots`` (again any time with ``python -m jrl.plot RUN_DIR``).
``trainer.log_val_generations=N`` keeps N validation samples per validation in
``val_generations.jsonl`` (and as a wandb table / tensorboard text).

Checkpoints: ``trainer.save_freq=N`` writes ``default_local_dir/global_step_N/{actor,critic}``
every N steps and at the last one; ``trainer.resume_mode=auto`` (default) continues from the latest
complete one, ``resume_path`` from ``trainer.resume_from_path``. ``python -m jrl.merge`` turns a
checkpoint into a Hugging Face folder. SIGINT/SIGTERM end the run after the current step with a
checkpoint (exit status 0); a NaN or infinite loss stops it before that step is saved (status 1).

Several processes (e.g. one per host) run as one: start the same command in each with
``JRL_COORDINATOR_ADDRESS=host:port`` (of process 0), ``JRL_NUM_PROCESSES`` and ``JRL_PROCESS_ID``
(SLURM, Open MPI and Cloud TPU pods are detected without them), and set ``trainer.nnodes`` x
``trainer.n_gpus_per_node`` to all their devices. They wait up to
``trainer.ray_wait_register_center_timeout`` seconds for each other; each loads and scores its
share of the rows; only process 0 prints, logs and writes the metrics; all write the checkpoints.

Compiled programs are cached under ``~/.cache/jrl/jax_compilation`` (``$JRL_COMPILATION_CACHE``
sets another folder; ``off`` disables it), so a repeated run starts faster. The time to the
first step is printed.

``--explain`` prints the resolved config instead of training: each key with its value, where it
comes from (default / card / override) and where it acts, or why it has no effect in this run.
At start-up a short notice lists the keys set away from their defaults that have no effect here
(torch, Ray or other engines' options), each with the reason.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import jax

from jrl.assets import prepare_for
from jrl.compile_cache import enable_compilation_cache
from jrl.config import ConfigError
from jrl.config.overrides import command_line_keys
from jrl.parallel import distributed
from jrl.plot import plot_after_training, validation_summary
from jrl.rollout.build import serving_engine
from jrl.runspec import load_config, n_gpus
from jrl.runspec.effects import no_effect_notice
from jrl.runspec.explain import explain
from jrl.runspec.rollout import rollout_spec
from jrl.runspec.spec import resolve_run
from jrl.trainer.io.tracking import METRICS_FILE
from jrl.trainer.loop.stopping import NonFiniteLossError
from jrl.trainer.ppo.trainer import PPOTrainer


def planned_engine(config: Any) -> str:
    """The rollout engine that would generate for `config` on this host's devices."""
    devices = jax.devices()[: n_gpus(config)]
    return serving_engine(rollout_spec(config), devices)[0]


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Load the config, prepare the experiment's assets, train; returns the last step's metrics."""
    began = time.perf_counter()
    argv = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return {}
    if "--explain" in argv:
        print(explain([a for a in argv if a != "--explain"], planned_engine), flush=True)
        return {}
    config, _ = load_config(argv)
    run = resolve_run(config)
    per_node = run.mesh.devices_per_node  # the rollout's own devices too, on a split run
    if run.placement is not None:
        per_node += run.placement.rollout_devices_per_node
    distributed.start(run.mesh.nnodes, per_node, run.mesh.join_timeout_s)
    enable_compilation_cache()
    prepare_for(config)

    start = time.perf_counter()
    metrics_file = Path(run.logging.run_dir) / METRICS_FILE
    written_before = metrics_file.stat().st_size if metrics_file.is_file() else 0
    trainer = PPOTrainer(run)
    print(trainer.describe(), flush=True)
    devices = list(trainer.actor.mesh.devices.flat)
    engine = serving_engine(run.rollout, devices)[0]
    notice = no_effect_notice(config, run.keys, engine, command_line_keys(argv))
    if notice and distributed.is_primary():
        print(notice, flush=True)
    plots: list = []
    try:
        metrics = trainer.fit()
    finally:
        if distributed.is_primary():
            plots = plot_after_training(run.logging.run_dir)
    print(f"jrl: training finished in {time.perf_counter() - start:.1f}s", flush=True)
    seconds = time.perf_counter() - began  # assets and set-up included
    summary = validation_summary(run.logging.run_dir, seconds, plots, written_before)
    if summary and distributed.is_primary():
        print(f"jrl: {summary}", flush=True)
    return metrics


def cli() -> int:
    """Entry point: clear one-line errors for bad configs and inputs, non-zero exit."""
    try:
        main()
    except (ConfigError, FileNotFoundError, ImportError, ValueError, NotImplementedError) as err:
        print(f"jrl.train: error: {err}", file=sys.stderr)
        return 2
    except NonFiniteLossError as err:
        print(f"jrl.train: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(cli())
