"""SFT on GSM8K worked solutions: verl's FSDP SFT example, with the documented defaults.

Full run: one node of 8 GPUs (80 GB each), gemma-1.1-7b-it, 7,473 training rows of GSM8K in
verl's parquet layout (`python -m jrl.data.gsm8k --local_dir ~/data/gsm8k`): 256 rows per step
= 29 steps per epoch, 4 epochs = 116 steps (not yet measured with jrl):

    python -m jrl.sft --config=configs/gsm8k_sft.py

The prompt is `extra_info.question` and the response the worked solution `extra_info.answer`
(verl's `prompt_key=extra_info prompt_dict_keys=[question]`), which ends in "#### <answer>" as
the GSM8K reward expects. Any key can be changed on the command line, e.g.
`model.partial_pretrain=Qwen/Qwen2.5-0.5B-Instruct trainer.n_gpus_per_node=1 model.lora_rank=32`.

Laptop preset (one CPU device, float32, a tiny random model and offline GSM8K-style data, 4
steps, about a minute on 2 CPU cores):

    python -m jrl.sft --config=configs/gsm8k_sft.py:tiny

The trained model is in `checkpoints/<project>/<experiment>/global_step_N/actor` (add `hf_model`
to `trainer.checkpoint.save_contents` for a Hugging Face folder in `actor/huggingface`, or run
`python -m jrl.merge`); `python -m jrl.generate` and
`python -m jrl.evaluate --config=configs/eval.py` then measure its GSM8K accuracy.
"""

from ml_collections import ConfigDict

from jrl.config import sft_config
from jrl.runspec import apply_sft_preset


def get_config(preset: str | None = None) -> ConfigDict:
    """The experiment; `preset` ('tiny') shrinks it to one CPU."""
    config = sft_config()

    # Data: question -> worked solution, 256 rows per step, sequences of up to 1,024 tokens.
    data = config.data
    data.train_files = "~/data/gsm8k/train.parquet"
    data.val_files = "~/data/gsm8k/test.parquet"
    data.prompt_key = "extra_info"
    data.response_key = "extra_info"
    data.prompt_dict_keys = ["question"]
    data.response_dict_keys = ["answer"]
    data.train_batch_size = 256
    data.micro_batch_size_per_gpu = 4
    data.max_length = 1024
    data.truncation = "error"

    # Model: full fine-tuning in float32 parameters (bfloat16 compute), no LoRA.
    model = config.model
    model.partial_pretrain = "~/models/gemma-1.1-7b-it"
    model.fsdp_config.model_dtype = "fp32"
    model.enable_gradient_checkpointing = False
    model.lora_rank = 0
    model.use_liger = False

    # Optimizer: AdamW, lr 1e-5 with 10% warmup and cosine decay, gradients clipped to 1.
    optim = config.optim
    optim.optimizer = "AdamW"
    optim.optimizer_impl = "torch.optim"
    optim.lr = 1e-5
    optim.weight_decay = 0.01
    optim.lr_warmup_steps_ratio = 0.1
    optim.clip_grad = 1.0
    optim.lr_scheduler = "cosine"

    # Trainer: 4 epochs on 8 GPUs; validation loss and a checkpoint after the last step.
    trainer = config.trainer
    trainer.nnodes = 1
    trainer.n_gpus_per_node = 8
    trainer.total_epochs = 4
    trainer.project_name = "gsm8k-sft"
    trainer.experiment_name = "gsm8k-sft-gemma-1.1-7b-it"
    trainer.logger = ["console", "wandb"]
    return apply_sft_preset(config, preset)
