"""``python -m jrl.sft``: supervised fine-tuning (verl's SFT trainer) from a config file.

Usage::

    python -m jrl.sft --config=configs/gsm8k_sft.py[:tiny] [overrides ...]

Without ``--config`` the defaults of verl's SFT trainer are used. Overrides use verl's
``a.b.c=value`` form or ``--config.a.b.c=value`` (values parse as in Hydra, e.g.
``data.prompt_dict_keys=[question]``).

Data: parquet files (``data.train_files``, ``data.val_files``; local, ``file://`` or any fsspec
URL). ``data.prompt_key`` / ``data.response_key`` name the columns (a dotted path such as
``extra_info.question`` reads a field of a struct column; ``data.prompt_dict_keys`` /
``data.response_dict_keys`` walk further). A prompt is a string or chat messages; the chat
template (``data.chat_template`` replaces the tokenizer's) is applied with the generation prompt
and the response is followed by the EOS token. The loss covers every response token, the EOS
included. ``data.multiturn.enable=true`` reads conversations from ``data.multiturn.messages_key``
and trains on the assistant messages. Sequences are padded to ``data.max_length``; longer ones fail
(``data.truncation=error``) or are cut (``left``/``right``).

Model: ``model.partial_pretrain`` (a Hugging Face folder, hub id or .gguf file), parameters in
``model.fsdp_config.model_dtype`` (fp32/bf16), computing in ``model.fsdp_config.dtype``;
``model.enable_gradient_checkpointing`` rematerialises each layer; ``model.lora_rank`` > 0 trains
LoRA adapters only (``lora_alpha``, ``target_modules``); ``model.use_liger=true`` computes the
loss with the fused log-prob kernel instead of materialising the logits; ``use_remove_padding``
packs the sequences of a micro-batch. ``model.fsdp_config.cpu_offload`` / ``offload_params`` are
accepted with a warning: parameters stay in device memory.

Optimizer: ``optim.optimizer`` AdamW/Adam/SGD of ``optim.optimizer_impl`` torch.optim (torchao and
bitsandbytes variants map to the same optax optimizer), ``optim.lr``, ``optim.betas``,
``optim.weight_decay``, ``optim.clip_grad``, ``optim.lr_scheduler`` cosine/wsd with
``optim.lr_warmup_steps_ratio`` warmup, ``optim.override_optimizer_config`` (torch keyword
arguments such as ``{eps: 1e-6}``).

Training: ``data.train_batch_size`` rows per step in micro-batches of
``data.micro_batch_size_per_gpu`` per device, ``trainer.total_epochs`` (or
``trainer.total_training_steps``). Every ``trainer.test_freq`` steps and after the last one the
validation loss ``val/loss`` is computed; checkpoints go to
``trainer.default_local_dir/global_step_N/actor`` every ``trainer.save_freq`` steps and after the
last one (``trainer.checkpoint.save_contents``: model, optimizer, extra, hf_model for a Hugging
Face folder in ``actor/huggingface``; ``trainer.max_ckpt_to_keep``). ``trainer.resume_mode=auto``
continues from the latest complete checkpoint, ``resume_path`` from ``trainer.resume_from_path``.
Loggers (``trainer.logger``) as in ``python -m jrl.train``; every step's metrics also go to
``<default_local_dir>/metrics.jsonl``. SIGINT/SIGTERM end the run after the current step with a
checkpoint (exit status 0); a NaN or infinite loss stops it (status 1).

Several processes run as one as with ``python -m jrl.train``: the same command in each, with
``JRL_COORDINATOR_ADDRESS``, ``JRL_NUM_PROCESSES`` and ``JRL_PROCESS_ID`` (or SLURM / Open MPI /
Cloud TPU detection) and ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` set to all their
devices; each loads its share of the rows, only process 0 prints and logs, and a signal to any
process stops all of them after the same step.
"""

from __future__ import annotations

import sys
import time

from jrl.compile_cache import enable_compilation_cache
from jrl.config.entry import INPUT_ERRORS, load_entry_config, run_entry
from jrl.config.trees import SFT
from jrl.parallel import distributed
from jrl.runspec.validate import validate_sft
from jrl.trainer.loop.stopping import NonFiniteLossError
from jrl.trainer.sft.trainer import SFTTrainer


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Load the config and train; returns the last step's metrics."""
    argv = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return {}
    config = load_entry_config(argv, SFT, validate_sft)
    run = SFTTrainer.resolve(config)
    distributed.start(run.mesh.nnodes, run.mesh.devices_per_node, run.mesh.join_timeout_s)
    enable_compilation_cache()

    start = time.perf_counter()
    trainer = SFTTrainer(run)
    print(trainer.describe(), flush=True)
    metrics = trainer.fit()
    print(f"jrl: SFT finished in {time.perf_counter() - start:.1f}s", flush=True)
    return metrics


def cli() -> int:
    """Entry point: one-line errors; status 2 for bad input, 1 for a non-finite loss."""
    return run_entry("jrl.sft", main, ((NonFiniteLossError, 1), (INPUT_ERRORS, 2)))


if __name__ == "__main__":
    sys.exit(cli())
