"""verl's profiler keys (``global_profiler`` and each role's ``profiler``) with their defaults:
jrl has no profiler of verl's, so these keys are refused away from their defaults
(`jrl.runspec.unsupported`), but they exist so that verl's configs load."""

from __future__ import annotations

from typing import Any

from ml_collections import ConfigDict
from ml_collections.config_dict import placeholder

from jrl.config.tree import section


def role_profiler() -> ConfigDict:
    """A role's profiler (verl's ProfilerConfig); tool and folder follow ``global_profiler``."""
    return section(
        tool="${global_profiler.tool}",
        enable=False,
        all_ranks=False,
        ranks=[],
        save_path="${global_profiler.save_path}",
        tool_config=section(
            nsys=section(discrete="${global_profiler.global_tool_config.nsys.discrete}"),
            npu=section(contents=[], level="level1", analysis=True, discrete=False),
            torch=section(step_start=0, step_end=placeholder(int)),
            torch_memory=section(
                trace_alloc_max_entries=(
                    "${global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries}"
                ),
                stack_depth="${global_profiler.global_tool_config.torch_memory.stack_depth}",
            ),
        ),
    )


def tool_free_profiler(enable: Any, all_ranks: Any, ranks: Any) -> ConfigDict:
    """A profiler whose tool options are the actor's (``tool_config`` null): the rollout's
    (every switch the actor's) and the reward model's."""
    return section(
        tool="${global_profiler.tool}",
        enable=enable,
        all_ranks=all_ranks,
        ranks=ranks,
        save_path="${global_profiler.save_path}",
        tool_config=placeholder(dict),
    )


def _nsight_options(**extra: Any) -> ConfigDict:
    options = {"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true"}
    return section(**options, **{"cuda-graph-trace": "graph"}, **extra)


def global_profiler() -> ConfigDict:
    return section(
        tool=placeholder(str),
        steps=placeholder(list),
        profile_continuous_steps=False,
        save_path="outputs/profile",
        global_tool_config=section(
            nsys=section(
                discrete=False,
                controller_nsight_options=_nsight_options(),
                worker_nsight_options=_nsight_options(
                    **{
                        "capture-range": "cudaProfilerApi",
                        "capture-range-end": placeholder(str),
                        "kill": "none",
                    }
                ),
            ),
            torch_memory=section(
                trace_alloc_max_entries=100000,
                stack_depth=32,
                context="all",
                stacks="all",
                kw_args=section(),
            ),
        ),
    )
