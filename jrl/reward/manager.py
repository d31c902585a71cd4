"""Reward managers: turn a batch of responses into token-level scores (verl's reward managers).

A manager decodes each row, scores it with a `compute_score` function and puts the score on the
row's last valid response token; every other position is 0.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.util
import inspect
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from jrl.batch import Batch
from jrl.reward.default import default_compute_score

ScoreFn = Callable[..., Any]


class NaiveRewardManager:
    """Scores rows one by one with `compute_score` (default: `default_compute_score`).

    Args:
      tokenizer: decodes prompts and responses (special tokens skipped).
      num_examine: how many decoded examples to print per data source on each call.
      compute_score: ``f(data_source, solution_str, ground_truth, extra_info) -> float | dict``;
        a dict must hold "score", and all its keys are returned per row as extra info.
      reward_fn_key: the meta field holding each row's data source.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        num_examine: int,
        compute_score: ScoreFn | None = None,
        reward_fn_key: str = "data_source",
    ):
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key

    def __call__(self, batch: Batch, return_dict: bool = False) -> np.ndarray | dict[str, Any]:
        """Token-level scores float32 [B, R] (or ``{"reward_tensor", "reward_extra_info"}``).

        Needs tensors ``prompts`` [B, P] (left-padded), ``responses`` [B, R] and ``attention_mask``
        [B, P + R], and meta ``reward_model`` (with "ground_truth"), the data source under
        `reward_fn_key` and optionally ``extra_info``. A row with an empty response gets no score
        anywhere (its row stays 0). Scores already in the batch (``rm_scores``) are returned as is.
        """
        if "rm_scores" in batch.tensors:
            scores = np.asarray(batch.tensors["rm_scores"], np.float32)
            return {"reward_tensor": scores, "reward_extra_info": {}} if return_dict else scores
        missing = [
            k
            for k in ("prompts", "responses", "attention_mask", "reward_model", self.reward_fn_key)
            if k not in batch
        ]
        if missing:
            raise KeyError(
                f"the batch to score lacks {missing} (the data source is read from "
                f"{self.reward_fn_key!r}, data.reward_fn_key); it has {sorted(batch.tensors)} "
                f"and {sorted(batch.meta)}"
            )
        prompts = np.asarray(batch["prompts"])
        responses = np.asarray(batch["responses"])
        mask = np.asarray(batch["attention_mask"])
        prompt_width = prompts.shape[1]
        prompt_lens = mask[:, :prompt_width].sum(-1)
        response_lens = mask[:, prompt_width:].sum(-1)
        extra_infos = batch.meta.get("extra_info", [None] * len(batch))

        reward = np.zeros(responses.shape, np.float32)
        extra: dict[str, list[Any]] = defaultdict(list)
        shown: Counter[str] = Counter()
        for i in range(len(batch)):
            prompt_str = self.tokenizer.decode(
                prompts[i, prompt_width - prompt_lens[i] :], skip_special_tokens=True
            )
            response_str = self.tokenizer.decode(
                responses[i, : response_lens[i]], skip_special_tokens=True
            )
            ground_truth = batch["reward_model"][i]["ground_truth"]
            data_source = batch[self.reward_fn_key][i]
            score = self.compute_score(
                data_source=data_source,
                solution_str=response_str,
                ground_truth=ground_truth,
                extra_info=dict(extra_infos[i] or {}),
            )
            if isinstance(score, dict):
                if "score" not in score:
                    raise KeyError(
                        f"the reward function returned a dict without 'score' for row {i} "
                        f"(data_source {data_source!r}): keys {sorted(score)}"
                    )
                for key, value in score.items():
                    extra[key].append(value)
                value = score["score"]
            else:
                value = score
            if response_lens[i] > 0:
                reward[i, response_lens[i] - 1] = value
            if shown[data_source] < self.num_examine:
                shown[data_source] += 1
                _show(prompt_str, response_str, ground_truth, score)
        if return_dict:
            return {"reward_tensor": reward, "reward_extra_info": dict(extra)}
        return reward


def _show(prompt: str, response: str, ground_truth: Any, score: Any) -> None:
    print("[prompt]", prompt)
    print("[response]", response)
    print("[ground_truth]", ground_truth)
    for key, value in (score if isinstance(score, dict) else {"score": score}).items():
        print(f"[{key}]", value)


REWARD_MANAGERS: dict[str, type[NaiveRewardManager]] = {"naive": NaiveRewardManager}


def load_custom_reward_fn(config: Any) -> ScoreFn | None:
    """The function named by custom_reward_function.path / .name, or None when no path is set.

    custom_reward_function.reward_kwargs are passed to every call (they win over the caller's).
    """
    section = getattr(config, "custom_reward_function", None)
    path = getattr(section, "path", None)
    if not path:
        return None
    name = getattr(section, "name", None) or "compute_score"
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(
            f"custom_reward_function.path={str(path)!r} does not exist; give the path of a Python "
            "file that defines the reward function"
        )
    module_name = "jrl_custom_reward_" + hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[module_name]
        raise RuntimeError(
            f"custom_reward_function.path={str(file)!r} failed to import: {err}"
        ) from err
    fn = getattr(module, name, None)
    if not callable(fn):
        defined = [
            k for k, v in vars(module).items() if inspect.isfunction(v) and not k.startswith("_")
        ]
        raise AttributeError(
            f"custom_reward_function.name={name!r} is not a function in {str(file)!r}; it defines "
            f"{', '.join(defined) or 'no functions'}"
        )
    print(f"jrl: reward function {name!r} from {file}")
    fixed = dict(getattr(section, "reward_kwargs", None) or {})
    return functools.partial(_call_with, fn, fixed)


def _call_with(fn: ScoreFn, fixed: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    result = fn(*args, **{**kwargs, **fixed})
    return asyncio.run(result) if inspect.iscoroutine(result) else result


def load_reward_manager(
    config: Any, tokenizer: PreTrainedTokenizerBase, num_examine: int
) -> NaiveRewardManager:
    """The manager named by reward_model.reward_manager, scoring with the custom reward function
    (custom_reward_function.*) or `default_compute_score`."""
    name = getattr(getattr(config, "reward_model", None), "reward_manager", None) or "naive"
    if name not in REWARD_MANAGERS:
        raise ValueError(
            f"reward_model.reward_manager={name!r} is not available; choose one of "
            f"{', '.join(REWARD_MANAGERS)}"
        )
    return REWARD_MANAGERS[name](
        tokenizer=tokenizer,
        num_examine=num_examine,
        compute_score=load_custom_reward_fn(config),
        reward_fn_key=getattr(getattr(config, "data", None), "reward_fn_key", None)
        or "data_source",
    )
