"""``python -m jrl.generate``: sample responses for a parquet file of prompts (verl's generation
script); the output is the input of ``python -m jrl.evaluate``.

Usage::

    python -m jrl.generate data.path=test.parquet data.output_path=gen.parquet \\
        model.path=MODEL rollout.name=jax [data.n_samples=5] [overrides ...]

``--config=FILE.py`` starts from a config file instead of the defaults (verl's generation config).
Each row's ``data.prompt_key`` column (chat messages or a string) goes through the model's chat
template with the generation prompt, left-padded to ``rollout.prompt_length`` tokens (longer
prompts fail unless ``data.truncation`` is left/right/middle). ``data.n_samples`` responses of at
most ``rollout.response_length`` tokens are sampled per prompt (``rollout.temperature``,
``top_k``, ``top_p``, ``do_sample``; ``rollout.seed`` seeds them), ``data.batch_size`` prompts at
a time on ``trainer.nnodes * trainer.n_gpus_per_node`` devices, with ``rollout.dtype`` weights.
Compiled programs are cached as ``python -m jrl.train`` caches them. The output parquet
``data.output_path`` holds every input column plus ``responses``: a list of ``data.n_samples``
decoded strings per row (special tokens removed). It is written to a temporary file and moved
into place when complete.

``rollout.name`` is ``jax`` (any backend) or ``vllm`` (CPU or GPU, when installed);
``rollout.n`` must stay 1 (``data.n_samples`` sets the responses per prompt).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from ml_collections import ConfigDict

from jrl.compile_cache import enable_compilation_cache
from jrl.config.entry import load_entry_config, run_entry
from jrl.config.trees import GENERATION
from jrl.data.atomic import atomic_file
from jrl.data.files import local_path, read_parquet
from jrl.data.loader import DataLoader
from jrl.data.rl_dataset import RLDataset
from jrl.data.tokenizer import load_tokenizer
from jrl.models import from_pretrained
from jrl.models.dtypes import parse_dtype
from jrl.parallel import make_mesh
from jrl.parallel.devices import check_device
from jrl.rollout.build import generating_engine, make_rollout, sampling_params
from jrl.rollout.sampling import as_token_ids
from jrl.rollout.spec import RolloutSpec
from jrl.runspec.eval_checks import validate_generation
from jrl.runspec.rollout import generation_spec

RESPONSES = "responses"


def prompt_dataset(config: ConfigDict, tokenizer: Any) -> Any:
    """The prompts of ``data.path`` tokenised as the RL trainer tokenises them, with
    ``data.apply_chat_template_kwargs`` (added with ``+``, as verl's generation reads it)."""
    data = ConfigDict(
        {
            "prompt_key": config.data.prompt_key,
            "max_prompt_length": config.rollout.prompt_length,
            "truncation": config.data.truncation,
            "shuffle": False,
            "apply_chat_template_kwargs": dict(config.data.get("apply_chat_template_kwargs") or {}),
        }
    )
    return RLDataset(config.data.path, tokenizer, data, config_key="data.path")


def build_rollout(config: ConfigDict, spec: RolloutSpec, tokenizer: Any) -> Any:
    """The rollout engine of `spec` (``rollout.name``; one that cannot serve this host falls back
    to jrl's JAX sampler, announced) with the model of ``model.path`` on the mesh."""
    check_device(str(config.trainer.device))
    mesh = make_mesh(config.trainer.nnodes * config.trainer.n_gpus_per_node)
    dtype = parse_dtype(spec.dtype)
    model = from_pretrained(
        spec.model_path,
        dtype=dtype,
        param_dtype=dtype,
        mesh=mesh,
        trust_remote_code=spec.trust_remote_code,
        external_lib=config.model.external_lib,
    )
    eos = {tokenizer.eos_token_id, *as_token_ids(model.config.eos_token_id)} - {None}
    return make_rollout(
        generating_engine(spec, list(mesh.devices.flat)),
        model,
        spec,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_ids=sorted(eos),
        mesh=mesh,
    )


def generate_responses(config: ConfigDict) -> list[list[str]]:
    """``data.n_samples`` decoded responses for each prompt row of ``data.path``, in row order."""
    spec = generation_spec(config)
    try:
        tokenizer = load_tokenizer(spec.model_path, trust_remote_code=spec.trust_remote_code)
    except (FileNotFoundError, OSError) as err:
        raise FileNotFoundError(f"model.path: {err}") from err
    dataset = prompt_dataset(config, tokenizer)
    rollout = build_rollout(config, spec, tokenizer)
    sampling = sampling_params(spec.sampling, rollout)
    loader = DataLoader(dataset, config.data.batch_size, shuffle=False, seed=0, drop_last=False)
    rng = jax.random.key(spec.seed)
    out: list[list[str]] = []
    for index, prompts in enumerate(loader.epoch(0)):
        batch = rollout.generate(prompts, sampling, jax.random.fold_in(rng, index)).to_numpy()
        responses = np.asarray(batch.tensors["responses"])
        lengths = np.asarray(batch.tensors["response_mask"]).sum(-1)
        texts = tokenizer.batch_decode(
            [row[:n].tolist() for row, n in zip(responses, lengths, strict=True)],
            skip_special_tokens=True,
        )
        n = sampling.n
        out += [texts[i : i + n] for i in range(0, len(texts), n)]
        print(f"jrl: generated {len(out)}/{len(dataset)} prompts", flush=True)
    return out


def write_output(config: ConfigDict, responses: list[list[str]]) -> Path:
    """``data.path`` with the `RESPONSES` column added, written to ``data.output_path``."""
    table = read_parquet(
        local_path(config.data.path, None, "data.path"), config.data.path, "data.path"
    )
    if RESPONSES in table.column_names:
        table = table.drop_columns([RESPONSES])
    table = table.append_column(RESPONSES, pa.array(responses, pa.list_(pa.string())))
    target = Path(config.data.output_path).expanduser()
    with atomic_file(target) as tmp:
        pq.write_table(table, tmp)
    return target


def main(argv: list[str] | None = None) -> Path | None:
    """Load the config, generate, write the output; returns its path."""
    argv = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return None
    config = load_entry_config(argv, GENERATION, validate_generation)
    enable_compilation_cache()
    target = write_output(config, generate_responses(config))
    print(f"jrl: wrote {target}", flush=True)
    return target


def cli() -> int:
    """Entry point: one-line errors and status 2 for bad configs and inputs."""
    return run_entry("jrl.generate", main)


if __name__ == "__main__":
    sys.exit(cli())
