"""Command-line arguments of a tiny SFT run on the digits task (prompt "3718=", response "3"),
shared by the SFT tests so that their runs reuse each other's compiled programs."""

from __future__ import annotations

from pathlib import Path

from jrl.assets import prepare_digits

REPO = Path(__file__).resolve().parents[1]
SFT_CARD = str(REPO / "configs" / "gsm8k_sft.py")


def digits_sft_args(run_dir: Path, *overrides: str) -> list[str]:
    """`:tiny` SFT card arguments for the digits task: 2 devices x 2 micro-batches of 16 rows,
    8 steps, validation and checkpoints every 4 steps, metrics in ``run_dir/metrics.jsonl``."""
    paths = prepare_digits()
    return [
        f"--config={SFT_CARD}:tiny",
        f"data.train_files={paths['train_files']}",
        f"data.val_files={paths['val_files']}",
        f"model.partial_pretrain={paths['model_path']}",
        "data.prompt_key=prompt",
        "data.response_key=reward_model.ground_truth",
        "data.prompt_dict_keys=null",
        "data.response_dict_keys=null",
        "data.max_length=8",
        "data.val_max_samples=64",
        "data.train_batch_size=64",
        "data.micro_batch_size_per_gpu=16",
        "trainer.n_gpus_per_node=2",
        "optim.lr=3e-3",
        "optim.lr_warmup_steps_ratio=0",  # the schedule spans all epochs (verl's); no warm-up
        "trainer.total_training_steps=8",
        "trainer.test_freq=4",
        "trainer.save_freq=4",
        "trainer.logger=['console','file']",
        f"trainer.default_local_dir={run_dir}",
        *overrides,
    ]
