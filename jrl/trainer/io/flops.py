"""Training FLOPs of a decoder and the peak FLOP/s of accelerators, for model FLOPs utilisation.

The count is verl's (``verl.utils.flops_counter``, causal since 2026): a forward and backward
pass costs 6 FLOPs per dense parameter per token, plus 6·s·s'·head_dim·heads per layer for a
sequence of s tokens attending to s' of them. That is the q·k and attention·v matmuls,
4·s·s'·head_dim per head forward and 3x that with the backward, halved because a causal mask
leaves half of the score matrix. s' is s, or the window on sliding-window layers (as verl counts
Gemma 3; verl's Llama/Qwen/Mistral counter ignores windows, which changes nothing for configs
without one).

A mixture of experts counts the parameters a token uses (verl's qwen3_moe counter): per sparse
layer its k experts' three matrices and the router, 3·H·k·I_e + H·E, in place of the dense MLP
(verl counts every layer as sparse; a layer that keeps a dense MLP counts that MLP here).
"""

from __future__ import annotations

from collections.abc import Sequence

from jrl.models.config import ModelConfig

# Dense bf16 peak FLOP/s per device, by a substring of JAX's `device_kind`.
PEAK_FLOPS = {
    "GB200": 2.5e15,
    "B200": 2.25e15,
    "H100": 989e12,
    "H200": 989e12,
    "H800": 989e12,
    "H20": 148e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362.05e12,
    "L40": 181.05e12,
    "A40": 149.7e12,
    "L20": 119.5e12,
    "MI300X": 1336e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
}


def active_params(config: ModelConfig) -> int:
    """N: per layer the q, k, v, o projections and the three (gated) MLP matrices (a sparse
    layer: its k experts' and the router), plus embedding and LM head (both counted, tied or
    not, as verl does)."""
    hidden, head_dim = config.hidden_size, config.head_dim
    attention = hidden * head_dim * (2 * config.num_heads + 2 * config.num_kv_heads)
    total = 2 * config.vocab_size * hidden
    for layer in range(config.num_layers):
        if config.is_sparse(layer):
            experts = config.experts
            mlp = 3 * hidden * experts.experts_per_token * experts.intermediate_size
            mlp += hidden * experts.num_experts
        else:
            mlp = 3 * hidden * config.intermediate_size
        total += attention + mlp
    return total


def train_flops(config: ModelConfig, seqlens: Sequence[int]) -> float:
    """FLOPs of one forward and backward pass over sequences of these lengths (unpadded)."""
    lengths = [int(s) for s in seqlens]
    attended = 0
    for layer in range(config.num_layers):
        window = config.sliding_window if config.is_sliding(layer) else None
        attended += sum(s * (min(s, window) if window else s) for s in lengths)
    dense = 6 * active_params(config) * sum(lengths)
    return float(dense + 6 * attended * config.head_dim * config.num_heads)


def peak_flops(device_kind: str) -> float | None:
    """Peak FLOP/s of one device of this kind (e.g. 'NVIDIA H100 80GB HBM3', 'TPU v5 lite');
    None when unknown (CPUs included)."""
    for key in sorted(PEAK_FLOPS, key=len, reverse=True):
        if key.lower() in device_kind.lower():
            return PEAK_FLOPS[key]
    return None
