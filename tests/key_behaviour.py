"""The behaviour sweep (issue 21): each key of a tiny card set to a non-default valid value, one
at a time, either changes what a real run does, is named in the no-effect notice, or is refused
(at load, or at start-up by a check that names it against the files or devices it names).

    python tests/key_behaviour.py grpo --out grpo.json    # ~10 min on 2 cores; ppo: ~18 min
    python tests/key_behaviour.py ppo --only critic.optim # keys or key prefixes

What a run does is its fingerprint: the metrics it logs (wall-clock figures left out), the
programs it compiles (StableHLO text without locations, hashed; `jax.clear_caches()` first so
every program is compiled or read from the persistent cache again), the names of the files it
writes (Orbax's hashed file names folded), the bytes its live arrays hold per memory kind when
training ends (host offload, a kept KV cache) and the modules of the user's files it imports.
Each probe resumes from one first step's checkpoint and runs a second step with validation and
a save, so the resume and checkpoint keys take part; a probe with ``trainer.resume_mode=disable``
runs both steps afresh. Two runs without changes must give the same fingerprint (`control`).

The keys and values are those of `every_key` (its contexts, companions and candidate values),
with `key_fixtures`' files for the keys that name one. `tests/test_key_behaviour.py` runs a few
keys in CI and the whole sweep with ``JRL_KEY_SWEEP=1``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import io
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, str(Path(__file__).parent))

import every_key  # noqa: E402
import jax  # noqa: E402
from jax._src import compiler  # noqa: E402
from key_fixtures import write_fixtures  # noqa: E402

from jrl import train  # noqa: E402
from jrl.config import ConfigError, load_config_file, loading  # noqa: E402
from jrl.config.moved import leaves  # noqa: E402
from jrl.config.overrides import parse_command_line  # noqa: E402
from jrl.parallel import memory_bytes  # noqa: E402
from jrl.runspec.effects import no_effect_reason  # noqa: E402
from jrl.runspec.spec import resolve_run  # noqa: E402
from jrl.trainer.ppo.trainer import PPOTrainer  # noqa: E402

WALL_CLOCK = (
    "timing_s/",
    "timing_per_token_ms/",
    "perf/time_per_step",
    "perf/throughput",
    "perf/max_memory",
    "perf/cpu_memory",
    "perf/mfu",
)
REPO = Path(__file__).resolve().parents[1]
RUN = ["trainer.save_freq=1", "trainer.test_freq=2", "trainer.val_before_train=False"]
# Keys the sweep sets itself: each probe's files are read from the folder it names.
OWN_KEYS = {"trainer.default_local_dir": "every probe writes where it says (the sweep sets it)"}
SAID = "said"  # the run's own lines (``jrl: ...``): not compared, searched for announcements
Changes = list[tuple[str, Any]]


def fingerprint(argv: list[str], folder: Path, changes: Changes) -> dict[str, list]:
    """What `jrl.train.main(argv)` with `changes` (as overrides) does in `folder`."""
    jax.clear_caches()
    programs: set[str] = set()
    compile_program, parse = compiler.compile_or_get_cached, loading.parse_command_line

    def recording(backend, computation, *args, **kwargs):
        text = computation.operation.get_asm(enable_debug_info=False)
        programs.add(hashlib.sha256(text.encode()).hexdigest()[:16])
        return compile_program(backend, computation, *args, **kwargs)

    def parsing(args):
        command = parse(args)
        return command._replace(overrides=[*command.overrides, *changes])

    resident: dict[str, int] = {}
    fit = PPOTrainer.fit

    def fitting(trainer):
        metrics = fit(trainer)
        gc.collect()  # arrays of earlier runs that only cycles still hold do not count
        resident.update(memory_bytes(jax.live_arrays()))
        return metrics

    here, imported, printed = Path.cwd(), set(sys.modules), io.StringIO()
    os.chdir(folder)  # relative paths a key names (dump folders, copies) land in the run's folder
    try:
        with (
            mock.patch.object(compiler, "compile_or_get_cached", recording),
            mock.patch.object(loading, "parse_command_line", parsing),
            mock.patch.object(PPOTrainer, "fit", fitting),
            contextlib.redirect_stdout(printed),
        ):
            train.main([*argv, f"trainer.default_local_dir={folder}"])
    finally:
        os.chdir(here)
    said = [line for line in printed.getvalue().splitlines() if line.startswith("jrl: ")]
    metrics = []
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        kept = sorted((k, v) for k, v in row["data"].items() if not k.startswith(WALL_CLOCK))
        metrics.append((row["step"], kept))
    names = {re.sub(r"[0-9a-f]{32}", "*", str(p.relative_to(folder))) for p in folder.rglob("*")}
    return {
        "metrics": metrics,
        "programs": sorted(programs),
        "files": sorted(names),
        "resident": sorted(resident.items()),
        "imports": users_modules(imported),
        SAID: said,
    }


def changed_parts(before: dict[str, list], after: dict[str, list]) -> list[str]:
    """The fingerprint parts in which two runs differ (their printed lines aside)."""
    return [part for part, seen in before.items() if part != SAID and after[part] != seen]


def users_modules(before: set[str]) -> list[str]:
    """The modules of the user's own files (outside the environment and this repository) that
    were imported since `before`, forgotten again so that every run imports them afresh."""
    installed = (sys.prefix, sys.base_prefix, str(REPO))
    found = []
    for name in set(sys.modules) - before:
        file = getattr(sys.modules[name], "__file__", None) or ""
        if file and not file.startswith(installed):
            found.append(name)
            del sys.modules[name]
    return sorted(found)


class Prober:
    """Resumed second steps of `card` from one first step's checkpoint under `root`."""

    def __init__(self, card: str, root: Path):
        card_path = REPO / every_key.CARDS[card]
        self.argv, self.root, self.count = [f"--config={card_path}", *RUN], root, 0
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        first = [
            *self.argv,
            "trainer.total_training_steps=1",
            f"trainer.default_local_dir={root}/0",
        ]
        train.main(first)

    def run(self, changes: Changes) -> dict[str, list]:
        self.count += 1
        folder = self.root / str(self.count)
        if ("trainer.resume_mode", "disable") in changes:
            folder.mkdir()
        else:
            shutil.copytree(self.root / "0", folder)
            (folder / "metrics.jsonl").unlink(missing_ok=True)
        try:
            return fingerprint([*self.argv, "trainer.total_training_steps=2"], folder, changes)
        finally:
            shutil.rmtree(folder)


def moved_value(raw, key: str, base) -> tuple[Any, str]:
    """(the value `every_key` moves `key` to, '') or (None, why none loads)."""
    loaded: Changes = []
    real_try = every_key._try

    def recording_try(raw_, key_, value_):
        result = real_try(raw_, key_, value_)
        if result[0] is not None:
            loaded.append((key_, value_))
        return result

    with mock.patch.object(every_key, "_try", recording_try):
        config, error = every_key._moved(raw, key, base)
    return (loaded[-1][1], "") if config is not None else (None, error)


def outcome(prober: Prober, raw, base, key: str, bases: dict[str, dict]) -> str:
    """'refused', 'announced', 'acts: <what changed>', or why the key does none of them."""
    value, error = moved_value(raw, key, base)
    if error:
        refused = every_key._refused(key, base, error)
        return "refused" if refused else f"no valid non-default value loads: {error[-200:]}"
    if key in OWN_KEYS:
        return f"acts: {OWN_KEYS[key]}"
    context = [*every_key.CONTEXTS.get(key, {}).items()]
    context += [(k, None) for k in every_key._companion(key)]
    run = [*parse_command_line(RUN).overrides, ("trainer.default_local_dir", str(prober.root))]
    config = every_key._load(raw, [*run, *context, (key, value)])
    keys = resolve_run(config).keys
    if no_effect_reason(key, config, keys, "jax", {key, *(k for k, _ in context)}):
        return "announced"
    try:  # a context that is no run alone (a partner key, an unset companion): the card is
        every_key._load(raw, [*run, *context])  # the base
        before = context
    except ConfigError:
        before = []
    label = json.dumps(before, default=str)
    try:
        if label not in bases:
            bases[label] = prober.run(before)
        changed = prober.run([*context, (key, value)])
    except Exception as err:  # noqa: BLE001 - a run the sweep could not make is an outcome
        if key in str(err):  # a check at start-up against the files or devices it names
            return f"refused at start-up: {type(err).__name__}: {str(err)[:200]}"
        return f"run failed ({key}={value!r}): {type(err).__name__}: {str(err)[-300:]}"
    moved = changed_parts(bases[label], changed)
    if moved:
        return f"acts: {', '.join(moved)}"
    if any(f"{key}=" in line for line in changed[SAID]):  # e.g. the vLLM fallback's line
        return "announced at start-up"
    return f"NEITHER ({key}={value!r})"


def sweep(card: str, root: Path, only: Sequence[str] = (), say=print) -> dict[str, str]:
    """{key: outcome} of every key of `card` (or of those in `only`, keys or key prefixes),
    probed under `root`; `say` gets one line per key. The fixtures' values and contexts apply
    while it runs (module state is restored after)."""
    prober = Prober(card, root / card)
    fixtures = root / "fixtures"
    values, contexts = write_fixtures(fixtures)
    values["trainer.val_before_train"] = True  # RUN turns it off
    with (
        mock.patch.dict(every_key.VALUES, values),
        mock.patch.dict(every_key.CONTEXTS, contexts),
        mock.patch.object(sys, "path", [str(fixtures), *sys.path]),
    ):
        control = [prober.run([]) for _ in range(2)]
        differ = changed_parts(*control)
        say(f"control: {differ}")
        raw = load_config_file(every_key.CARDS[card])[0]
        base = every_key._load(raw, [])
        bases: dict[str, dict] = {"[]": control[0]}
        outcomes: dict[str, str] = {"control": "the same" if not differ else f"differs: {differ}"}
        for key, _ in leaves(base):
            if only and not any(key == k or key.startswith(f"{k}.") for k in only):
                continue
            outcomes[key] = outcome(prober, raw, base, key, bases)
            say(f"{key}: {outcomes[key]}")
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("card", choices=sorted(every_key.CARDS))
    parser.add_argument("--root", default="/tmp/jrl_key_behaviour")
    parser.add_argument("--out", help="JSON file of {key: outcome}")
    parser.add_argument("--only", nargs="*", default=(), help="keys (or key prefixes) to probe")
    args = parser.parse_args()
    began = time.perf_counter()
    outcomes = sweep(args.card, Path(args.root), args.only, lambda line: print(line, flush=True))
    print(f"{len(outcomes) - 1} keys in {time.perf_counter() - began:.0f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(outcomes, indent=1))


if __name__ == "__main__":
    main()
