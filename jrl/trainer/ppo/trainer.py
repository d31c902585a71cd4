"""The PPO family's trainer: its roles, and one step in verl's order.

generate -> reward -> old log-prob -> ref log-prob -> values -> advantages (`experience`) ->
critic update -> actor update (after ``critic_warmup``). The fit loop (`jrl.trainer.loop.fit`)
runs the steps, validates (``test_freq``) and saves (``save_freq``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jrl import algos
from jrl.agent import AgentContext, AgentRollout
from jrl.agent.trace import RolloutTracer
from jrl.batch import Batch
from jrl.config.loading import yaml_of
from jrl.data.loader import DataLoader
from jrl.data.rl_dataset import create_rl_dataset
from jrl.data.tokenizer import tokenizer_of
from jrl.models.moe import ROUTED_EXPERTS
from jrl.parallel import (
    barrier,
    batch_axes,
    gather_batch,
    host_batch,
    is_primary,
    make_mesh,
    score_per_process,
)
from jrl.parallel.devices import check_device
from jrl.parallel.distributed import exchange_on
from jrl.parallel.mesh import split_devices
from jrl.reward.guard import fault_metrics, finite_rewards
from jrl.reward.manager import load_reward_manager
from jrl.rollout import log_prob_mismatch_metrics, route_mismatch_metrics
from jrl.rollout.build import build_rollout, sampling_params
from jrl.runspec.spec import RunSpec, resolve_run
from jrl.trainer.io.checkpoint import CheckpointManager, RoleSnapshot
from jrl.trainer.io.generations import write_generations
from jrl.trainer.io.metrics import (
    data_metrics,
    memory_metrics,
    mfu_metrics,
    throughput_metrics,
    timer,
    turn_metrics,
)
from jrl.trainer.io.tracking import mlflow_store_uri
from jrl.trainer.loop.fit import Cadence, StepOutput, epochs_of, fit
from jrl.trainer.loop.resume import resume
from jrl.trainer.loop.stopping import DataExhausted
from jrl.trainer.overlap.split import split_rollout
from jrl.trainer.overlap.split_run import SplitRun
from jrl.trainer.ppo.dynamic_sampling import GroupCollector, take_rows
from jrl.trainer.ppo.experience import advantage_phase
from jrl.trainer.ppo.validation import select_val_generations, validation_metrics
from jrl.trainer.roles.actor import Actor
from jrl.trainer.roles.critic import Critic
from jrl.trainer.roles.reference import Reference
from jrl.trainer.roles.reward_model import RewardModel
from jrl.trainer.update.balance import balance_order


class PPOTrainer:
    """Builds every role from a `RunSpec` (`from_config`: from a checked config); supplies the fit
    loop with verl's PPO step."""

    name = "Training Progress"
    prompt_stream: Iterator[tuple[int, Batch]]  # the loader's batches, with dynamic sampling

    @classmethod
    def from_config(cls, config: Any) -> PPOTrainer:
        """The trainer of a checked config (`jrl.runspec.load_config`)."""
        return cls(resolve_run(config))

    def __init__(self, run: RunSpec):
        self.created_at = time.perf_counter()
        check_device(run.mesh.device)
        self.run = run
        trainer_devices, self.rollout_devices = jax.devices(), None
        if run.placement is not None:
            per_node = run.mesh.devices_per_node
            trainer_devices, self.rollout_devices = split_devices(
                jax.devices(), per_node, run.placement.rollout_devices_per_node
            )
            exchange_on(trainer_devices)  # the rollout's thread exchanges on its own
        self.mesh = make_mesh(
            run.mesh.devices,
            fsdp_size=run.mesh.fsdp_size,
            sequence_parallel=run.mesh.sequence_parallel,
            tensor_parallel=run.mesh.tensor_parallel,
            devices=trainer_devices,
            expert_parallel=run.mesh.expert_parallel,
        )
        data, files = run.data, run.data.files
        self.tokenizer = tokenizer_of(data.tokenizer)
        self.train_dataset = create_rl_dataset(
            files.train_files, self.tokenizer, data.rows, max_samples=files.train_max_samples
        )
        self.val_dataset = create_rl_dataset(
            files.val_files,
            self.tokenizer,
            data.rows,
            max_samples=files.val_max_samples,
            config_key="data.val_files",
        )
        self.train_loader = DataLoader(
            self.train_dataset, data.gen_batch_size, shuffle=data.shuffle, seed=run.trainer.seed
        )
        self.cadence = Cadence.of(run.cadence, len(self.train_loader))
        total = self.cadence.total_steps
        self.actor = Actor.create(run.actor, run.algorithm, self.mesh, total)
        self.ref = None if run.ref is None else Reference.create(run.ref, self.mesh, self.actor)
        self.critic = None if run.critic is None else Critic.create(run.critic, self.mesh, total)
        self.model_configs = {"actor": self.actor.learner.model().config}
        if self.critic is not None:
            self.model_configs["critic"] = self.critic.learner.model().config
        self.vocab_size = int(self.model_configs["actor"].vocab_size)
        actor = self.actor
        self.split: SplitRun | None = None
        if self.rollout_devices is None:
            self.rollout = build_rollout(
                run.rollout,
                actor.learner.graphdef,
                actor.params,
                actor.mesh,
                self.tokenizer,
                lora=actor.spec.model.lora,
            )
        else:
            engine, weight_sync = split_rollout(
                run.rollout, run.placement, actor, self.rollout_devices, self.tokenizer
            )
            self.rollout = engine
        if run.agent is not None:  # each row's trajectory runs its agent loop over the engine
            template = data.rows.apply_chat_template_kwargs
            trace = run.agent.trace
            tracer = RolloutTracer(
                trace,
                self.tokenizer,
                project=run.logging.project,
                experiment=run.logging.experiment,
                tracking_uri=mlflow_store_uri(run.logging.run_dir) if trace.backend else "",
                writer=jax.process_index() == 0,
            )
            context = AgentContext.build(run.agent, self.tokenizer, template, tracer)
            self.rollout = AgentRollout(self.rollout, context, run.logging.tree)
        self.sampling = sampling_params(run.rollout.sampling, self.rollout)
        self.val_sampling = sampling_params(run.rollout.validation, self.rollout)
        self.rng = jax.random.key(run.trainer.seed)
        if self.rollout_devices is not None:
            self.split = SplitRun(
                run.placement,
                engine,
                weight_sync,
                self.rollout_devices,
                lambda: self.actor.params,
                generate=self.generate_rows,
                sampling=self.sampling,
                key=jax.random.fold_in(self.rng, 2),
                prompt_width=data.rows.max_prompt_length,
                response_length=run.rollout.response_length,
                mini_prompts=run.actor.update.mini_rows // self.sampling.n,
                agent=self.rollout if isinstance(self.rollout, AgentRollout) else None,
            )
        self.reward_model = (
            None if run.reward_model is None else RewardModel(run.reward_model, self.mesh)
        )
        self.reward_fn = load_reward_manager(run.reward, self.tokenizer, num_examine=0)
        self.val_reward_fn = load_reward_manager(run.reward, self.tokenizer, num_examine=1)
        in_reward = run.algorithm.kl_in_reward
        self.kl_ctrl = None if in_reward is None else algos.get_kl_controller(in_reward.kl_ctrl)
        self.val_generations: list[dict[str, Any]] = []
        self.checkpoints = CheckpointManager(
            run.checkpoint.local_dir,
            max_to_keep=run.checkpoint.retention,
            remote_dir=run.checkpoint.remote_dir,
            tokenizer=self.tokenizer,
        )

    # -- one training step ------------------------------------------------------------------
    def generate(self, prompts: Batch, step: int, draw: int = 0) -> Batch:
        """Rollout `n` responses per prompt (interleaved), with a key derived from the step (and
        from `draw`, the step's generation batch, after its first)."""
        key = jax.random.fold_in(jax.random.fold_in(self.rng, 0), step)
        if draw:
            key = jax.random.fold_in(key, draw)
        self._trace_step(step)
        return self.rollout.generate(prompts, self.sampling, key)

    def generate_rows(self, prompts: Batch, step: int) -> tuple[Batch, dict[str, float]]:
        """`step`'s rollout of its first `prompts` (`tagged`), whole on the host, and the
        engine's metrics."""
        batch = host_batch(self.generate(self.tagged(prompts, step, 0), step))
        return batch, dict(self.rollout.stats)

    def tagged(self, prompts: Batch, step: int, draw: int) -> Batch:
        """Every process's `prompts`, each with its group's ``uid`` (numbered on from the step's
        earlier generation batches: `draw` of them, as large)."""
        prompts = gather_batch(prompts)
        first = draw * len(prompts)
        uids = np.array([f"{step}-{first + i}" for i in range(len(prompts))], dtype=object)
        return prompts.union(Batch(meta={"uid": uids}))

    def _trace_step(self, step: int, validate: bool = False) -> None:
        """Tag the agent loops' traces (``rollout.trace``) of the next rollout."""
        if isinstance(self.rollout, AgentRollout):
            self.rollout.at_step(step, validate)

    def make_experience(
        self, prompts: Batch, step: int, timing: dict[str, float]
    ) -> tuple[Batch, dict[str, float]]:
        """Generate, score, and add old/ref log-probs, values and advantages (steps 1-8 of
        verl); returns the batch and its metrics, timing each phase into `timing`."""
        spec, algorithm = self.run.trainer, self.run.algorithm
        metrics: dict[str, float] = {}
        if algorithm.filter_groups is None:
            batch = self.rollout_batch(prompts, step, 0, timing, metrics)
            if spec.balance_batch:
                batch, _ = self.balanced(batch, {}, metrics)
            batch, extra_info = self.scored(batch, timing, metrics)
        else:
            batch, extra_info = self.filtered_batch(prompts, step, timing, metrics)
            if spec.balance_batch:
                batch, extra_info = self.balanced(batch, extra_info, metrics)
        if self.split is not None:
            metrics.update(self.split.version_metrics(batch))
        if spec.rollout_data_dir:
            with timer("dump_rollout_generations", timing):
                self.dump_rollout(batch, extra_info, step)
        bypass = algorithm.rollout_correction.bypass_mode
        if bypass:  # the rollout's log-probs are the old ones; the actor's loss corrects
            batch = batch.union(Batch({"old_log_probs": batch.tensors["rollout_log_probs"]}))
        else:
            with timer("old_log_prob", timing):
                batch = self.add_old_log_probs(batch, metrics)
        if self.ref is not None:
            with timer("ref", timing):
                ref_log_prob, _ = self.ref.compute_log_prob(batch)
                batch = batch.union(Batch({"ref_log_prob": ref_log_prob}))
        if self.critic is not None:
            with timer("values", timing):
                batch = batch.union(Batch({"values": self.critic.compute_values(batch)}))
        with timer("adv", timing):
            batch, adv_metrics = advantage_phase(batch, algorithm, self.kl_ctrl, bypass)
            metrics.update(adv_metrics)
        return batch, metrics

    def rollout_batch(
        self,
        prompts: Batch,
        step: int,
        draw: int,
        timing: dict[str, float],
        metrics: dict[str, float],
        groups: int | None = None,
    ) -> Batch:
        """The step's `draw`-th generation batch (0: its first) with its ``uid`` per prompt
        (numbered on from the step's earlier batches) and, for ReMax, its greedy baselines;
        fully async, `groups` of the rollouter's (None: a step's)."""
        if self.split is not None:  # fully async: the rollouter took the prompts itself
            last = self.cadence.total_steps
            batch, stats = self.split.rows(prompts, step, last, timing, groups)
        else:
            with timer("gen", timing):
                batch = host_batch(self.generate(self.tagged(prompts, step, draw), step, draw))
            stats = self.rollout.stats
        metrics.update(stats)
        if self.run.algorithm.estimator.needs_greedy_baseline:
            with timer("gen_max", timing):
                baselines = self.greedy_baselines(self.tagged(prompts, step, draw))
                batch = batch.union(Batch({"reward_baselines": baselines}))
        return batch

    def balanced(
        self, batch: Batch, extra_info: dict[str, list[Any]], metrics: dict[str, float]
    ) -> tuple[Batch, dict[str, list[Any]]]:
        """`batch`'s rows reordered for equal work per data-parallel shard
        (``trainer.balance_batch``), and the reward's extra-info columns with them."""
        dp_size = int(np.prod([self.mesh.shape[axis] for axis in batch_axes()]))
        order, balance = balance_order(batch, dp_size)
        metrics.update(balance)
        return batch.reorder(order), take_rows(extra_info, order)

    def scored(
        self, batch: Batch, timing: dict[str, float], metrics: dict[str, float]
    ) -> tuple[Batch, dict[str, list[Any]]]:
        """`batch` with its ``token_level_scores`` (the reward model's scores first, when the
        run has one) and the reward's extra-info columns; fault counts added to `metrics`."""
        with timer("reward", timing):
            if self.reward_model is not None:
                batch = batch.union(Batch({"rm_scores": self.reward_model.rm_scores(batch)}))
            reward = self.rewards(self.reward_fn, batch)
            batch = batch.union(Batch({"token_level_scores": reward["reward_tensor"]}))
        extra_info = {key: list(values) for key, values in reward["reward_extra_info"].items()}
        for name, count in fault_metrics(extra_info).items():
            metrics[name] = metrics.get(name, 0.0) + count
        return batch, extra_info

    def filtered_batch(
        self, prompts: Batch, step: int, timing: dict[str, float], metrics: dict[str, float]
    ) -> tuple[Batch, dict[str, list[Any]]]:
        """DAPO's dynamic sampling (`dynamic_sampling.GroupCollector`): generation batches,
        scored and filtered, drawn from the data loader until ``train_batch_size`` prompts
        whose groups' metric varies are kept; the rows of the first ``train_batch_size``.
        Fully async, each draw takes the groups still needed from the rollouter, and the
        dropped ones give their places back (`SplitRun.refund`)."""
        collector = GroupCollector(self.run.algorithm.filter_groups)
        streamed = self.split is not None  # (fully async) each draw: the groups still needed
        while True:
            needed = collector.settings.train_batch_size - collector.kept if streamed else None
            draw = collector.gen_batches
            batch = self.rollout_batch(prompts, step, draw, timing, metrics, needed)
            dropped = collector.filtered
            collector.add(*self.scored(batch, timing, metrics))
            if streamed:  # fresh prompts take the dropped groups' places
                self.split.refund(collector.filtered - dropped)
            if collector.full:
                break
            collector.check_limit(step, self.run.data.gen_batch_size)
            if not streamed:  # (the rollouter takes its own prompts)
                prompts = self.next_prompts(step, collector.kept)
        metrics.update(collector.metrics())
        return collector.batch()

    def next_prompts(self, step: int, kept: int) -> Batch:
        """The loader's next batch for a step that needs more prompts; `DataExhausted` at the
        end of the data (the run ends after the step before, as verl's DAPO recipe)."""
        try:
            return next(self.prompt_stream)[1]
        except StopIteration:
            target = self.run.data.files.train_batch_size
            raise DataExhausted(
                f"step {step} kept {kept} of the {target} prompts it trains on when the data "
                f"ran out (trainer.total_epochs={self.run.cadence.total_epochs})"
            ) from None

    @staticmethod
    def rewards(reward_fn: Any, batch: Batch) -> dict[str, Any]:
        """`reward_fn` (a reward manager) over `batch`, each process scoring its own rows, with
        rows of non-finite scores zeroed and counted (`finite_rewards`)."""
        return finite_rewards(score_per_process(reward_fn, batch), reward_fn)

    def add_old_log_probs(self, batch: Batch, metrics: dict[str, float]) -> Batch:
        """`batch` with the actor's ``old_log_probs`` (and under router replay R2 the routes the
        update replays); logs ``actor/entropy`` and, when the rollout gave log-probs or routes,
        their mismatch to the actor's into `metrics`."""
        old_log_probs, entropy, routes = self.actor.old_log_probs(batch)
        batch = batch.union(Batch({"old_log_probs": old_log_probs}))
        recorded = batch.tensors.get(ROUTED_EXPERTS)
        if routes is not None and recorded is not None:
            attention = batch.tensors["attention_mask"]
            metrics.update(route_mismatch_metrics(recorded, routes, attention))
        if routes is not None and self.actor.spec.router_replay == "R2":
            batch = batch.union(Batch({ROUTED_EXPERTS: routes}))
        mask = batch.tensors["response_mask"]
        if "rollout_log_probs" in batch.tensors:
            rollout = batch.tensors["rollout_log_probs"]
            metrics.update(log_prob_mismatch_metrics(rollout, np.asarray(old_log_probs), mask))
        metrics["actor/entropy"] = float(
            algos.agg_loss(entropy, mask, self.run.algorithm.loss_agg_mode)
        )
        return batch

    def dump_rollout(
        self, batch: Batch, reward_extra_infos: Mapping[str, Sequence[Any]], step: int
    ) -> None:
        """``trainer.rollout_data_dir``: the step's scored generations as verl's JSONL."""
        if is_primary():
            scores = np.asarray(batch.tensors["token_level_scores"]).sum(-1).tolist()
            texts = self.decode(batch)
            self.dump_generations(
                self.run.trainer.rollout_data_dir, batch, texts, scores, reward_extra_infos, step
            )

    def decode(self, batch: Batch) -> tuple[list[str], list[str]]:
        """`batch`'s prompts and responses as text, without special tokens."""
        return self._decode(batch.tensors["prompts"]), self._decode(batch.tensors["responses"])

    def _decode(self, ids: Any) -> list[str]:
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True)

    def dump_generations(
        self,
        folder: str,
        batch: Batch,
        texts: tuple[list[str], list[str]],
        scores: list[float],
        reward_extra_infos: Mapping[str, Sequence[Any]],
        step: int,
    ) -> None:
        """``<folder>/<step>.jsonl`` (`write_generations`) with each row's ground truth."""
        gts = [
            (info or {}).get("ground_truth")
            for info in batch.meta.get("reward_model", [None] * len(batch))
        ]
        write_generations(folder, step, *texts, gts, scores, reward_extra_infos)

    def greedy_baselines(self, prompts: Batch) -> np.ndarray:
        """The baseline of an estimator that needs a greedy rollout (ReMax's): the score of one
        greedy answer per prompt, repeated for its n rows."""
        greedy = dataclasses.replace(self.sampling, do_sample=False, n=1)
        with self.split.idle(synced=False) if self.split else contextlib.nullcontext():
            batch = host_batch(self.rollout.generate(prompts, greedy, self.rng))
        reward = self.rewards(self.reward_fn, batch)
        return np.repeat(reward["reward_tensor"].sum(-1), self.sampling.n)

    def train_step(
        self, prompts: Batch, step: int, epoch: int, timing: dict[str, float]
    ) -> StepOutput:
        """One PPO step on a batch of prompts: experience, critic and actor updates."""
        batch, metrics = self.make_experience(prompts, step, timing)
        if self.critic is not None:
            with timer("update_critic", timing):
                metrics.update(self.critic.update(batch, step))
        if self.run.trainer.updates_actor(step):
            lr_step = self.run.trainer.actor_schedule_step(step)
            with timer("update_actor", timing):
                metrics.update(self.actor.update(batch, step, lr_step))
            if self.split is None:
                with timer("update_weights", timing):
                    self.rollout.update_weights(self.actor.params)
        if self.split is not None:  # a version a step, the critic's warm-up too (verl's count)
            # one-step-off syncs as it starts a generation, fully async on its trigger
            metrics.update(self.split.updated(timing))
            metrics.update(self.split.step_metrics())
        return StepOutput(metrics, batch)

    def step_metrics(
        self, output: StepOutput, step: int, epoch: int, timing: dict[str, float]
    ) -> dict[str, float]:
        """verl's data, timing, throughput, MFU and memory metrics of the finished step."""
        batch = output.batch
        metrics = data_metrics(batch, self.critic is not None)
        metrics.update({f"timing_s/{k}": v for k, v in timing.items()})
        rollout_devices = len(self.rollout_devices) if self.rollout_devices else 0
        metrics.update(throughput_metrics(batch, timing, self.run.mesh.devices + rollout_devices))
        metrics.update(self.mfu(batch, timing))
        metrics.update(memory_metrics())
        metrics.update({"training/global_step": step, "training/epoch": epoch})
        return metrics

    def mfu(self, batch: Batch, timing: dict[str, float]) -> dict[str, float]:
        """``perf/mfu/actor`` (and ``/critic``) of this step's updates (none on CPU)."""
        seqlens = np.asarray(batch.tensors["attention_mask"]).sum(-1)
        roles = {"actor": self.actor, "critic": self.critic}
        out: dict[str, float] = {}
        for name, model_config in self.model_configs.items():
            seconds = timing.get(f"update_{name}")
            if seconds:
                out.update(
                    mfu_metrics(
                        model_config,
                        seqlens,
                        seconds,
                        epochs=roles[name].spec.train.plan.epochs,
                        world_size=self.run.mesh.devices,
                        role=name,
                    )
                )
        return out

    def validate(self, step: int) -> dict[str, float]:
        """Greedy (val_kwargs) generation on the validation set, scored per data source, with
        verl's ``val-core``/``val-aux`` metrics; keeps ``log_val_generations`` samples in
        `val_generations` and dumps all of them to ``trainer.validation_data_dir``."""
        loader = DataLoader(
            self.val_dataset,
            len(self.val_dataset),
            shuffle=self.run.data.validation_shuffle,
            seed=self.run.trainer.seed,
            drop_last=False,
        )
        with self.split.idle() if self.split else contextlib.nullcontext():
            return self._validate(loader, step)

    def _validate(self, loader: DataLoader, step: int) -> dict[str, float]:
        prompts = gather_batch(next(iter(loader.epoch(0))))
        infos = prompts.meta.get("reward_model")
        first = (infos[0] if infos is not None and len(infos) else None) or {}
        if self.reward_model is not None and first.get("style") == "model":
            return {}  # as verl: no validation when the set's first row is model-scored
        if "uid" not in prompts.meta:  # as verl: the dataset's own uids group its rows
            uids = np.array([f"val-{i}" for i in range(len(prompts))], dtype=object)
            prompts = prompts.union(Batch(meta={"uid": uids}))
        key = jax.random.fold_in(self.rng, 1)
        self._trace_step(step, validate=True)
        batch = host_batch(self.rollout.generate(prompts, self.val_sampling, key))
        reward = self.rewards(self.val_reward_fn, batch)
        scores = reward["reward_tensor"].sum(-1).tolist()
        infos = {"reward": scores, **reward["reward_extra_info"]}  # verl's order: reward first
        self.keep_val_generations(prompts, batch, scores, infos, step)
        sources = batch.meta.get("data_source", np.full(len(batch), "unknown", dtype=object))
        metrics = validation_metrics(sources, batch.meta["uid"], infos)
        return {**metrics, **turn_metrics(batch, prefix="val-aux/")}

    def keep_val_generations(
        self,
        prompts: Batch,
        batch: Batch,
        scores: list[float],
        infos: Mapping[str, Sequence[Any]],
        step: int,
    ) -> None:
        """The validation samples for the loggers (``log_val_generations``) and the dump of them
        all (``validation_data_dir``, by the primary process). Their inputs are the dataset's
        prompts, as verl decodes them (an agent loop's first prompt may add its tools)."""
        count, folder = self.run.trainer.log_val_generations, self.run.trainer.validation_data_dir
        dump = bool(folder) and is_primary()
        if not (count or dump):
            return
        answers = len(batch) // len(prompts)
        inputs = [
            text for text in self._decode(prompts.tensors["input_ids"]) for _ in range(answers)
        ]
        texts = (inputs, self._decode(batch.tensors["responses"]))
        if count:
            self.val_generations = select_val_generations(*texts, scores, step, count)
        if dump:
            self.dump_generations(folder, batch, texts, scores, infos, step)

    # -- checkpoints ------------------------------------------------------------------------------
    def save_checkpoint(self, step: int) -> None:
        """Starts writing ``global_step_<step>`` (actor, critic) in the background."""
        contents = self.run.checkpoint.roles
        actor_extra = {
            "global_step": step,
            "lr_step": step,
            "rng_key": np.asarray(jax.random.key_data(self.rng)).tolist(),
            "data_loader": self.train_loader.get_state(),
            "kl_coef": None if self.kl_ctrl is None else self.kl_ctrl.value,
        }
        if self.split is not None:  # drained: the generated rows not trained on yet
            actor_extra.update(self.split.checkpoint(self.train_loader.get_state()))
        roles = {
            "actor": RoleSnapshot(
                self.actor.learner,
                list(contents["actor"].save_contents),
                actor_extra,
                lora=self.actor.spec.model.lora,
                base_model=self.actor.spec.model.path,
            )
        }
        if self.critic is not None:
            roles["critic"] = RoleSnapshot(
                self.critic.learner,
                list(contents["critic"].save_contents),
                {"global_step": step, "lr_step": step},
                kind="value",
            )
        self.checkpoints.save(step, roles)

    def resume(self) -> int:
        """Restores the checkpoint that ``trainer.resume_mode`` selects (actor, critic, RNG,
        data position, KL coefficient); returns its global step (0 from scratch)."""
        checkpoint = self.run.checkpoint
        learners = {"actor": self.actor.learner}
        if self.critic is not None:
            learners["critic"] = self.critic.learner
        roles = {
            name: (learner, checkpoint.roles[name].load_contents)
            for name, learner in learners.items()
        }
        step, folder, extra = resume(checkpoint, roles, self.train_loader)
        if folder is None:
            return 0
        if extra:
            self.rng = jax.random.wrap_key_data(jnp.asarray(extra["rng_key"], jnp.uint32))
            if self.kl_ctrl is not None and extra.get("kl_coef") is not None:
                self.kl_ctrl.value = float(extra["kl_coef"])
        if self.ref is not None and self.actor.spec.model.lora is not None:
            self.ref = Reference.from_actor(self.run.ref, self.actor)
        if self.split is None:
            self.rollout.update_weights(self.actor.params)
        else:
            self.split.restore(extra or {}, step)
            self.split.sync()
        if checkpoint.delete_after_load:
            barrier("jrl.restored")
            if is_primary():
                shutil.rmtree(folder)
        print(f"jrl: resumed from {folder} at global step {step}", flush=True)
        return step

    # -- the loop -------------------------------------------------------------------------------
    def batches(self) -> Iterator[tuple[int, Batch]]:
        """(epoch, prompts) for the rest of training, from the data loader's position. With
        DAPO's dynamic sampling a step takes further batches from the same stream
        (`next_prompts`), and data that runs out ends the run (`DataExhausted`)."""
        stream = epochs_of(self.train_loader, self.run.cadence.total_epochs or 1)
        if self.split is not None:  # the rollout side takes the prompts ahead of the steps
            return self.split.batches(stream, self.train_loader.get_state)
        if self.run.algorithm.filter_groups is None:
            return stream
        self.prompt_stream = stream
        return self._step_prompts()

    def _step_prompts(self) -> Iterator[tuple[int, Batch]]:
        """(epoch, the first prompts of a step) from `prompt_stream`, until the data ends."""
        while True:
            try:
                yield next(self.prompt_stream)
            except StopIteration:
                raise DataExhausted("the data ran out between steps") from None

    def fit(self) -> dict[str, float]:
        """Train to the last step (`Cadence.total_steps`); returns its metrics."""
        try:
            return fit(self, self.run.logging, self.created_at)
        finally:
            if self.split is not None:
                self.split.close()
                exchange_on(None)

    def describe(self) -> str:
        """The resolved configuration, as printed at start-up."""
        return yaml_of(self.run.logging.tree)
