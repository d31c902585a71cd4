"""What verl's SFT keys become: the SFT run's mesh (every device: FSDP, and sequences split over
``ulysses_sequence_parallel_size`` of them), its trained model
(`SFTModelSpec`) and its data (`SFTDataSpec`).

- The model: ``model.partial_pretrain`` loaded as `ModelSettings` (compute dtype
  ``model.fsdp_config.dtype``, LoRA adapters initialised from ``trainer.seed``), micro-batches of
  ``data.micro_batch_size_per_gpu`` rows per data-parallel rank (only without it, the deprecated
  global ``data.micro_batch_size`` split over the ranks), packed with ``use_remove_padding``; the
  loss by the fused kernel with ``model.use_liger``; the ``optim`` section.
- The data: the files and caps, ``data.train_batch_size`` rows per step, shuffled each epoch as
  verl's SFT sampler does (seed 0 and the epoch; ``trainer.seed`` seeds only LoRA's adapters);
  the tokenizer of ``model.partial_pretrain`` with ``data.chat_template``; `SFTDataSettings` of
  the keys `SFTDataset` reads (a user's class in ``data.custom_cls`` gets the whole ``data``
  section).
"""

from __future__ import annotations

import dataclasses
import warnings
from types import MappingProxyType

from jrl.data.settings import MultiTurn, SFTDataSettings, TokenizerSettings
from jrl.optim.settings import SFTOptimizerSettings
from jrl.runspec.data import DataFiles, data_files, user_dataset
from jrl.runspec.models import ModelSettings, model_settings
from jrl.runspec.optim import sft_optimizer_settings
from jrl.runspec.reads import KeyReads
from jrl.runspec.roles import BatchSplit
from jrl.runspec.run import MeshSpec

# ``model.fsdp_config`` keys that ask for host offload, which SFT accepts but does not do.
HOST_OFFLOAD_KEYS = ("cpu_offload", "offload_params")


@dataclasses.dataclass(frozen=True)
class SFTModelSpec:
    """SFT's trained model: how it is loaded, how a batch splits into micro-batches (`split`),
    whether the loss runs the fused log-prob kernel (`fused_loss`: ``model.use_liger``), its
    optimizer, and the host-offload keys the user set (`host_offload`; the states stay in device
    memory, which the trainer says)."""

    model: ModelSettings
    split: BatchSplit
    fused_loss: bool
    optimizer: SFTOptimizerSettings
    host_offload: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class SFTDataSpec:
    """SFT's data: its files and batch size, the rows shuffled each epoch as verl's sampler
    seeded `seed` shuffles them, the tokenizer and how rows become sequences (`rows`)."""

    files: DataFiles
    seed: int
    tokenizer: TokenizerSettings
    rows: SFTDataSettings


# verl's SFT rows are shuffled by torch's DistributedSampler with its default seed (0) reseeded
# with each epoch's number; trainer.seed does not reach it.
SAMPLER_SEED = 0
# How long the processes of a multi-process run wait for each other to join (verl's SFT trainer
# has no key for it; the RL trainer's trainer.ray_wait_register_center_timeout default).
JOIN_TIMEOUT_S = 300


def sft_mesh_spec(config: KeyReads) -> MeshSpec:
    """Every device of ``trainer.nnodes * n_gpus_per_node``: FSDP over the devices that
    ``ulysses_sequence_parallel_size`` leaves, sequences split over that many."""
    trainer = config.trainer
    devices = int(trainer.nnodes * trainer.n_gpus_per_node)
    return MeshSpec(
        device=str(trainer.device),
        devices=devices,
        nnodes=int(trainer.nnodes),
        join_timeout_s=JOIN_TIMEOUT_S,
        fsdp_size=-1,
        sequence_parallel=int(config.ulysses_sequence_parallel_size),
        tensor_parallel=1,
    )


def sft_model_spec(config: KeyReads) -> SFTModelSpec:
    """The SFTModelSpec of an SFT config."""
    model, data = config.model, config.data
    fsdp = model.fsdp_config
    settings = model_settings(
        model,
        fsdp,
        section="model",
        path_key="partial_pretrain",
        lora_seed=int(config.trainer.seed),
    )
    packed = bool(config.use_remove_padding)
    per_gpu = data.micro_batch_size_per_gpu
    if per_gpu:
        split = BatchSplit(micro_rows=int(per_gpu), remove_padding=packed)
        if data.micro_batch_size is not None:
            warnings.warn(
                f"data.micro_batch_size={data.micro_batch_size} has no effect: verl's SFT "
                f"trainer reads data.micro_batch_size_per_gpu ({per_gpu})",
                stacklevel=2,
            )
    else:
        split = BatchSplit(global_rows=int(data.micro_batch_size), remove_padding=packed)
    return SFTModelSpec(
        model=settings,
        split=split,
        fused_loss=bool(model.use_liger),
        optimizer=sft_optimizer_settings(config.optim),
        host_offload=tuple(key for key in HOST_OFFLOAD_KEYS if fsdp.get(key)),
    )


def sft_data_settings(data: KeyReads) -> SFTDataSettings:
    """The SFT ``data`` keys that `SFTDataset` reads."""
    multiturn = data.multiturn
    return SFTDataSettings(
        prompt_key=data.prompt_key,
        prompt_dict_keys=_keys(data.prompt_dict_keys),
        response_key=data.response_key,
        response_dict_keys=_keys(data.response_dict_keys),
        multiturn=MultiTurn(
            enable=bool(multiturn.enable),
            messages_key=multiturn.messages_key,
            tools_key=multiturn.tools_key,
            enable_thinking_key=multiturn.enable_thinking_key,
        ),
        max_length=int(data.max_length),
        truncation=data.truncation,
        apply_chat_template_kwargs=MappingProxyType(data.apply_chat_template_kwargs.whole()),
        cache_dir=data.cache_dir,
        custom_cls=user_dataset(data),
    )


def _keys(value: list[str] | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(value)


def sft_data_spec(config: KeyReads) -> SFTDataSpec:
    """The SFTDataSpec of an SFT config."""
    data, model = config.data, config.model
    return SFTDataSpec(
        files=data_files(data),
        seed=SAMPLER_SEED,
        tokenizer=TokenizerSettings(
            path=model.partial_pretrain,
            trust_remote_code=bool(model.trust_remote_code),
            chat_template=data.chat_template,
            key="model.partial_pretrain",
        ),
        rows=sft_data_settings(data),
    )
