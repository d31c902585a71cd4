"""``python -m jrl.merge``: a jrl checkpoint's actor or critic as a Hugging Face model folder.

Usage::

    python -m jrl.merge merge --local_dir CKPT/global_step_N/actor --target_dir OUT [--backend jax]
    python -m jrl.merge test --local_dir CKPT/global_step_N/actor --test_hf_dir REF_MODEL
    python -m jrl.merge verify --local_dir CKPT[/global_step_N]

`--local_dir` is a role folder (``actor`` or ``critic``) of a step written under
``trainer.default_local_dir``; it must hold the ``model`` item (``checkpoint.save_contents``).
``merge`` writes safetensors weights, config.json, generation_config.json and the tokenizer to
`--target_dir`: an actor becomes a ``*ForCausalLM`` model, a critic a ``*ForTokenClassification``
model with one label. LoRA adapters are merged into their base weights, so the folder is a plain
model. An existing model folder at `--target_dir` is replaced once the new one is complete; a
non-empty folder that holds no config.json is refused. The subcommand ``merge`` may be omitted.

``test`` merges into a temporary folder and compares every tensor with those of `--test_hf_dir`
(``--atol``/``--rtol``, default 1e-6 each); it lists each difference and exits with 1 when any.

``verify`` checks one step folder, or every step of a run folder, against its manifest: each file
present with its size and the checksum of its bytes, no file added, the manifest matching its own
digest. It prints each step's state (intact, incomplete or damaged, with the file) and exits with
0 only when every step is intact. ``merge`` and ``test`` refuse a step that is not intact.

``--backend`` is ``jax`` (default) or ``fsdp``, which means the same here (verl's scripts pass it).
``--trust-remote-code`` is passed to the tokenizer loader. Merging runs on the host CPU; no
accelerator and no device mesh are needed (``JAX_PLATFORMS=cpu`` keeps JAX off any GPU).

From Python: ``jrl.merge.merge_checkpoint(local_dir, target_dir)``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx, traverse_util

from jrl.models import ModelConfig, apply_lora, save_pretrained
from jrl.models.decoder import model_class
from jrl.models.lora import LoraSettings, adapted_modules
from jrl.models.safetensors_io import SafetensorsCheckpoint, SafetensorsTensor
from jrl.trainer.io.step_folders import (
    HF_FOLDER,
    MANIFEST_FILE,
    TRACKER_FILE,
    CheckpointError,
    problems,
    read_manifest,
    read_tracker,
    step_folders,
    step_state,
)

Progress = Callable[[str], None]
_ROLE_HINT = "give a role folder of a checkpoint, e.g. DIR/global_step_N/actor or …/critic"


def _quiet(_: str) -> None:
    """Progress reporter that reports nothing."""


def _role_entry(role_dir: Path) -> dict[str, Any]:
    """The manifest entry (items, kind, lora) of a complete checkpoint's role folder."""
    if not role_dir.is_dir():
        raise CheckpointError(f"{role_dir} does not exist; {_ROLE_HINT}")
    if (role_dir / MANIFEST_FILE).is_file():
        roles = sorted(read_manifest(role_dir).get("roles", {}))
        names = ", ".join(str(role_dir / role) for role in roles) or "none"
        raise CheckpointError(f"{role_dir} is a step folder, not a role folder; its roles: {names}")
    step = role_dir.parent
    if not (step / MANIFEST_FILE).is_file():
        raise CheckpointError(
            f"{role_dir} is not a role folder of a jrl checkpoint: {step / MANIFEST_FILE} is "
            f"missing; {_ROLE_HINT}"
        )
    roles = read_manifest(step).get("roles", {})
    if role_dir.name not in roles:
        raise CheckpointError(
            f"{role_dir} is not a saved role: {step / MANIFEST_FILE} lists no "
            f"{role_dir.name!r} role, only {sorted(roles)}"
        )
    found = problems(step, [role_dir.name], contents=True)
    if found:
        raise CheckpointError(f"{step} is incomplete or damaged: " + "; ".join(found[:5]))
    entry = roles[role_dir.name]
    if "model" not in entry.get("items", []):
        hint = (
            f"its {role_dir / HF_FOLDER} folder already holds the weights (hf_model)"
            if "hf_model" in entry.get("items", [])
            else "save with 'model' in checkpoint.save_contents"
        )
        raise CheckpointError(
            f"{role_dir} has no 'model' item (it holds {entry.get('items')}); {hint}"
        )
    return entry


def _abstract_model(config: ModelConfig, kind: str, lora: dict[str, Any] | None) -> nnx.Module:
    """The role's model (with its LoRA adapters) as shapes only."""
    cls = model_class(kind)

    def build() -> nnx.Module:
        model = cls(config, rngs=nnx.Rngs(0))
        return apply_lora(model, LoraSettings(**lora)) if lora else model

    return nnx.eval_shape(build)


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(map(str, path))


def _restore_target(model_dir: Path, wanted: dict[str, Any]) -> dict[str, Any]:
    """Restore target for the pure parameter dict `wanted` (shapes from the model, dtypes from
    the checkpoint, everything on the host CPU); fails naming the parameters that differ."""
    metadata = ocp.StandardCheckpointHandler().metadata(epath.Path(model_dir)).tree
    saved = {_dotted(k): v for k, v in traverse_util.flatten_dict(metadata).items()}
    flat = traverse_util.flatten_dict(wanted)
    names = {_dotted(k): k for k in flat}
    lines = [f"{name}: only in the checkpoint" for name in sorted(saved.keys() - names.keys())]
    lines += [f"{name}: not in the checkpoint" for name in sorted(names.keys() - saved.keys())]
    lines += [
        f"{name}: {tuple(saved[name].shape)} in the checkpoint, {flat[key].shape} in config.json"
        for name, key in sorted(names.items())
        if name in saved and tuple(saved[name].shape) != tuple(flat[key].shape)
    ]
    if lines:
        more = f" (and {len(lines) - 6} more)" if len(lines) > 6 else ""
        raise CheckpointError(
            f"{model_dir} does not match the model that {model_dir.parent / HF_FOLDER}/config.json "
            "and the manifest's LoRA settings describe: " + "; ".join(lines[:6]) + more
        )
    cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    return traverse_util.unflatten_dict(
        {
            key: jax.ShapeDtypeStruct(flat[key].shape, saved[name].dtype, sharding=cpu)
            for name, key in names.items()
        }
    )


def restore_model(local_dir: str | os.PathLike, progress: Progress = _quiet) -> nnx.Module:
    """The model of a checkpoint's role folder (actor: CausalLM, critic: ValueModel) with the
    saved parameters on the host CPU, LoRA adapters attached as trained (not merged)."""
    role_dir = Path(local_dir).expanduser().resolve()
    return _restore(role_dir, _role_entry(role_dir), progress)


def _restore(role_dir: Path, entry: dict[str, Any], progress: Progress) -> nnx.Module:
    """`restore_model` of a role folder whose manifest `entry` has been checked."""
    kind, lora = entry.get("kind", "causal_lm"), entry.get("lora")
    config = ModelConfig.from_hf(json.loads((role_dir / HF_FOLDER / "config.json").read_text()))
    adapters = f"LoRA rank {lora['rank']}" if lora else "no LoRA"
    progress(f"reading {role_dir} ({kind}, {config.model_type}, {adapters})")
    graphdef, state = nnx.split(_abstract_model(config, kind, lora))
    target = _restore_target(role_dir / "model", nnx.to_pure_dict(state))
    leaves = jax.tree.leaves(target)
    size = sum(leaf.size * leaf.dtype.itemsize for leaf in leaves) / 2**20
    progress(f"restoring {len(leaves)} arrays ({size:.1f} MiB) from {role_dir / 'model'}")
    with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as checkpointer:
        try:
            params = checkpointer.restore(role_dir / "model", args=ocp.args.StandardRestore(target))
        except (ValueError, KeyError, OSError) as err:
            first = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
            raise CheckpointError(f"could not read {role_dir / 'model'}: {first}") from err
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state)


def _check_target(target: Path, step: Path) -> None:
    """Refuses a target inside (or around) the checkpoint, a file, or a non-model folder."""
    if target == step or step in target.parents or target in step.parents:
        raise CheckpointError(
            f"--target_dir {target} overlaps the checkpoint {step}; choose a folder outside it"
        )
    if target.exists() and not target.is_dir():
        raise CheckpointError(f"--target_dir {target} is a file; give a folder path")
    if target.is_dir() and any(target.iterdir()) and not (target / "config.json").is_file():
        raise CheckpointError(
            f"--target_dir {target} is a non-empty folder without config.json; merging would "
            "replace it, so remove it or choose another folder"
        )


def _load_tokenizer(hf_dir: Path, trust_remote_code: bool, progress: Progress) -> Any:
    """The tokenizer saved with the checkpoint, or None when it holds none."""
    if not any(hf_dir.glob("tokenizer*")):
        progress(f"{hf_dir} holds no tokenizer; writing the model without one")
        return None
    progress(f"loading the tokenizer from {hf_dir}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        hf_dir, local_files_only=True, trust_remote_code=trust_remote_code
    )


def merge_checkpoint(
    local_dir: str | os.PathLike,
    target_dir: str | os.PathLike,
    *,
    trust_remote_code: bool = False,
    progress: Progress = _quiet,
) -> Path:
    """Writes the role folder `local_dir` of a jrl checkpoint as a Hugging Face model folder at
    `target_dir` (LoRA adapters merged in, tokenizer copied); returns the folder's path."""
    role_dir = Path(local_dir).expanduser().resolve()
    target = Path(target_dir).expanduser().resolve()
    entry = _role_entry(role_dir)
    _check_target(target, role_dir.parent)
    model = _restore(role_dir, entry, progress)
    tokenizer = _load_tokenizer(role_dir / HF_FOLDER, trust_remote_code, progress)
    if target.is_dir() and any(target.iterdir()):
        progress(f"{target} exists; it is replaced once the new folder is complete")
    merged = " (LoRA adapters merged into the base weights)" if adapted_modules(model) else ""
    progress(f"writing {target}{merged}")
    save_pretrained(model, target, tokenizer)
    progress(f"done: {target}")
    return target


def _read(tensor: SafetensorsTensor) -> np.ndarray:
    return np.asarray(tensor[tuple(slice(None) for _ in tensor.shape)], np.float32)


def compare_folders(
    merged: str | os.PathLike, reference: str | os.PathLike, *, atol: float, rtol: float
) -> tuple[int, list[str]]:
    """Compares every safetensors tensor of two HF folders; returns the number of tensors in
    `reference` and one line per difference (name, dtype, shape or values)."""
    ours, ref = SafetensorsCheckpoint(merged), SafetensorsCheckpoint(reference)
    lines = [f"{name}: missing from the merged model" for name in sorted(ref.keys() - ours.keys())]
    lines += [f"{name}: not in {reference}" for name in sorted(ours.keys() - ref.keys())]
    for name in sorted(ours.keys() & ref.keys()):
        a, b = ours[name], ref[name]
        if a.shape != b.shape:
            lines.append(f"{name}: shape {a.shape} merged, {b.shape} in the reference")
        elif a.dtype != b.dtype:
            lines.append(f"{name}: dtype {a.dtype} merged, {b.dtype} in the reference")
        else:
            x, y = _read(a), _read(b)
            if not np.allclose(x, y, atol=atol, rtol=rtol):
                diff = np.abs(x - y)
                lines.append(
                    f"{name}: values differ (max abs diff {diff.max():.3g}, "
                    f"{np.count_nonzero(diff > atol + rtol * np.abs(y))} of {y.size} elements)"
                )
    return len(ref), lines


# verl's model-merger flags that jrl reads from the checkpoint instead, by flag.
VERL_READ_ELSEWHERE = {
    "tie-word-embedding": "tying is read from the checkpoint's config.json",
    "is-value-model": "a critic is told by its checkpoint (role critic)",
    "use_cpu_initialization": "jrl streams the arrays on the host anyway",
}


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--backend",
        choices=("jax", "fsdp"),
        default="jax",
        help="checkpoint format: jax (fsdp is accepted and means the same)",
    )
    common.add_argument(
        "--local_dir", required=True, help="role folder: DIR/global_step_N/actor or …/critic"
    )
    common.add_argument(
        "--trust-remote-code",
        "--trust_remote_code",
        dest="trust_remote_code",
        action="store_true",
        help="let the tokenizer loader run code from the checkpoint's huggingface folder",
    )
    for flag, why in VERL_READ_ELSEWHERE.items():  # both spellings, as verl's
        names = dict.fromkeys([f"--{flag}", f"--{flag.replace('-', '_')}"])
        common.add_argument(*names, action="store_true", help=f"verl's flag, accepted: {why}")
    parser = argparse.ArgumentParser(
        prog="python -m jrl.merge",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    operations = parser.add_subparsers(dest="operation", required=True)
    merge = operations.add_parser(
        "merge", parents=[common], help="write the checkpoint as a Hugging Face model folder"
    )
    merge.add_argument(
        "--target_dir", default="tmp", help="the Hugging Face folder to write (tmp, as verl's)"
    )
    merge.add_argument(
        "--hf_upload_path", default=None, help="verl uploads there; jrl refuses (no network)"
    )
    merge.add_argument("--private", action="store_true", help="verl's upload flag; no effect")
    test = operations.add_parser(
        "test", parents=[common], help="merge to a temporary folder and compare with a reference"
    )
    test.add_argument("--test_hf_dir", required=True, help="reference Hugging Face folder")
    test.add_argument("--atol", type=float, default=1e-6, help="absolute tolerance (1e-6)")
    test.add_argument("--rtol", type=float, default=1e-6, help="relative tolerance (1e-6)")
    verify = operations.add_parser(
        "verify", help="check every file of a step (or of each step of a run) against its checksum"
    )
    verify.add_argument(
        "--local_dir", required=True, help="a step folder DIR/global_step_N, or a run folder DIR"
    )
    return parser


def verify(local_dir: str | os.PathLike) -> int:
    """Prints the state of each step under `local_dir` (and, for a run folder, its tracker);
    0 when all are intact (and the tracker readable), else 1."""
    folders = step_folders(local_dir)
    if not folders:
        raise CheckpointError(f"{local_dir} holds no global_step_<N> folder")
    intact = 0
    for folder in folders:
        state, found = step_state(folder)
        intact += state == "intact"
        print(f"{folder.name}: {state}" + (f": {'; '.join(found[:3])}" if found else ""))
    tracker_ok = True
    if folders != [Path(local_dir).expanduser().absolute()]:  # a run folder
        try:
            tracked = read_tracker(local_dir)
            print(
                f"{TRACKER_FILE}: " + ("missing" if tracked is None else f"global_step_{tracked}")
            )
        except CheckpointError as err:
            tracker_ok = False
            print(f"{TRACKER_FILE}: {err}")
    print(f"jrl.merge: {intact} of {len(folders)} step(s) intact")
    return 0 if intact == len(folders) and tracker_ok else 1


def _progress(message: str) -> None:
    print(f"jrl.merge: {message}", flush=True)


def _test(args: argparse.Namespace) -> int:
    reference = Path(args.test_hf_dir).expanduser().resolve()
    if not reference.is_dir():
        raise FileNotFoundError(f"--test_hf_dir {reference} does not exist")
    with tempfile.TemporaryDirectory(prefix="jrl-merge-") as tmp:
        merged = merge_checkpoint(
            args.local_dir,
            Path(tmp) / "merged",
            trust_remote_code=args.trust_remote_code,
            progress=_progress,
        )
        _progress(f"comparing with {reference}")
        total, lines = compare_folders(merged, reference, atol=args.atol, rtol=args.rtol)
    for line in lines:
        print(f"MISMATCH {line}")
    if lines:
        print(f"jrl.merge: {len(lines)} difference(s) against {reference} ({total} tensors there)")
        return 1
    print(f"jrl.merge: all {total} tensors match {reference}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status (0 ok, 1 test mismatch, 2 error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in ("merge", "test", "verify", "-h", "--help"):
        argv.insert(0, "merge")
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        if args.operation == "test":
            return _test(args)
        if args.operation == "verify":
            return verify(args.local_dir)
        if args.hf_upload_path:
            raise ValueError(
                f"--hf_upload_path={args.hf_upload_path}: jrl.merge does not upload; merge, then "
                f"upload {args.target_dir} with huggingface_hub (e.g. `hf upload`)"
            )
        merge_checkpoint(
            args.local_dir,
            args.target_dir,
            trust_remote_code=args.trust_remote_code,
            progress=_progress,
        )
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        print(f"jrl.merge: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
