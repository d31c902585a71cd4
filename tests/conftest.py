"""Test set-up: 8 simulated CPU devices (before JAX is imported) and a per-session asset cache;
shared fixtures."""

import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# vLLM's own log handler would write to the sys.stdout of its first import, which pytest's capture
# closes after that test: its records go through the logging module instead.
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")


@pytest.fixture(scope="session")
def train_tokenizer(tmp_path_factory):
    """`train(texts, vocab_size)`: a tiny byte-level BPE tokenizer (ChatML template) trained on
    `texts`, saved in a fresh temporary folder."""
    from jrl.data import train_tiny_tokenizer

    def train(texts, vocab_size: int):
        folder = tmp_path_factory.mktemp("tok") / "tiny"
        return train_tiny_tokenizer(texts, folder, vocab_size=vocab_size)

    return train


@pytest.fixture
def fake_vllm(monkeypatch):
    """`vllm` and `vllm.inputs` as modules holding the stand-ins of `fake_vllm.py`, at a supported
    version (vLLM cannot run here)."""
    from fake_vllm import install_fake_vllm

    install_fake_vllm(monkeypatch)


@pytest.fixture(scope="module")
def jax_run():
    """A tiny model and the jax engine's greedy output (n=2, 5 of 8 response tokens)."""
    import jax
    from fake_vllm import TINY_PROMPTS, TINY_SAMPLING, prompt_batch
    from helpers import TINY_LLAMA

    from jrl.models import init_random
    from jrl.rollout import JaxRollout

    model = init_random(TINY_LLAMA, seed=3)
    engine = JaxRollout(model, response_length=8, pad_token_id=0, eos_token_ids=1)
    prompts = prompt_batch(*TINY_PROMPTS)
    return model, prompts, engine.generate(prompts, TINY_SAMPLING, jax.random.key(0)).to_numpy()


@pytest.fixture(autouse=True)
def _no_persistent_cache_for_tpu_targets(request):
    """Programs compiled for a TPU topology from this host (no TPU client) cannot be read back
    from JAX's persistent cache, which other tests of the same worker may have switched on: the
    `*_tpu.py` tests compile without it."""
    if not request.module.__name__.endswith("_tpu"):
        yield
        return
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    yield
    jax.config.update("jax_enable_compilation_cache", enabled)
    compilation_cache.reset_cache()


def pytest_collection_modifyitems(config, items):
    """Files with a `slow` test first. Two workers take whole files in collection order
    (pyproject: `--dist loadfile --no-loadscope-reorder`), so a long file collected last would
    leave one worker running it alone at the end."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
