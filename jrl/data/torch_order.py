"""The row orders of verl's samplers, drawn as torch draws them, without torch.

torch's CPU generator is a Mersenne Twister (MT19937) seeded by ``manual_seed(s)`` as
numpy's legacy seeding seeds one, and ``torch.randperm(n, generator=g)`` is a Fisher-Yates
shuffle with n - 1 draws: for i = 0 .. n - 2, z = g.random() % (n - i), swap r[i] and r[i + z].

verl's samplers over an epoch's rows:
- RL (`verl.trainer.main_ppo.create_rl_sampler`): torch's ``RandomSampler`` with one generator
  seeded ``data.seed`` for the whole run; each epoch draws two permutations (the second, sliced to
  no rows, only advances the generator) and uses the first, so epoch e is draw number 2e.
- SFT (``fsdp_sft_trainer``): torch's ``DistributedSampler`` (seed 0), whose epoch e is the first
  permutation of a generator seeded 0 + e; a global batch is a contiguous block of it (each rank
  takes every world-th row of the block).
"""

from __future__ import annotations

import numpy as np

_SKIP_CHUNK = 1 << 22  # draws discarded at once while skipping ahead


def torch_generator(seed: int) -> np.random.MT19937:
    """A generator in the state of ``torch.Generator().manual_seed(seed)``."""
    generator = np.random.MT19937()
    generator._legacy_seeding(int(seed))
    return generator


def torch_randperm(n: int, generator: np.random.MT19937) -> np.ndarray:
    """``torch.randperm(n, generator=generator)`` (int64), advancing `generator` as torch does."""
    order = np.arange(n, dtype=np.int64)
    draws = generator.random_raw(max(n - 1, 0))
    for i, raw in enumerate(draws.tolist()):
        z = i + raw % (n - i)
        order[i], order[z] = order[z], order[i]
    return order


def random_sampler_epoch(n: int, seed: int, epoch: int) -> np.ndarray:
    """Epoch `epoch`'s row order of torch's ``RandomSampler`` over `n` rows with one generator
    seeded `seed` (verl's RL sampler): the permutation after 2 * epoch earlier ones."""
    generator = torch_generator(seed)
    skip = 2 * epoch * max(n - 1, 0)
    while skip > 0:
        generator.random_raw(min(skip, _SKIP_CHUNK))
        skip -= _SKIP_CHUNK
    return torch_randperm(n, generator)


def distributed_sampler_epoch(n: int, seed: int, epoch: int) -> np.ndarray:
    """Epoch `epoch`'s row order of torch's ``DistributedSampler`` (before each rank takes its
    rows): the permutation of a generator seeded `seed` + `epoch` (verl's SFT sampler)."""
    return torch_randperm(n, torch_generator(seed + epoch))
