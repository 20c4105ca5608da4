"""AgenticPipeline: the training loop.

    for step in range(start_step, max_steps):
        sync weights actor_train -> actor_infer            (every model_update_frequency steps; between turns)
        every eval_steps: start val_rollout.collect         runs alongside the training rollout
        batch = train rollout of this step                  env managers x actor_infer, multi-turn; with
                                                            async_generation_ratio k it was played ahead,
                                                            on weights at most k versions old
        batch = adjust(batch)                               whole optimizer steps (batch_adjust_mode)
        batch |= reference log-probs                        only when a KL term is on
        batch |= actor_train old log-probs
        batch |= critic values                              only for gae
        batch  = advantages(batch)                          reward norm -> token rewards (+KL) -> estimator
        critic update; actor update (after critic_warmup)   ppo_epochs, mini/micro batches
        checkpoint every save_steps; log every logging_steps

Resource choreography (cluster start-up, weight sync, checkpoints) sits behind one call each.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from roll.agentic.advantage import compute_batch_advantages
from roll.agentic.async_rollouts import RolloutsAhead, RolloutsNow, bound_staleness
from roll.agentic.baselines import baseline_metrics
from roll.agentic.batch_adjust import adjust_batch
from roll.agentic.conversation import ChatTemplate
from roll.agentic.env_managers.base import EpisodeLimits
from roll.agentic.render import filmstrip, transcript
from roll.agentic.rollout import EnvManagerHost, RolloutResult, import_path, make_rollout, ray_factory
from roll.agentic.rollout_dump import load_rollout, save_rollout, write_rows
from roll.agentic.sync_check import probe_batch, sync_gap
from roll.algorithms.kl import AdaptiveKLController, FixedKLController, kl_controller
from roll.algorithms.losses import ActorLossConfig
from roll.algorithms.reward_norm import RunningMeanStd
from roll.algorithms.train_infer import Correction, FilterRule, train_infer_correction
from roll.configs.derive import (
    async_ratio,
    data_parallel_size,
    dual_clip_constant,
    effective_pg_variant,
    global_train_batch_size,
    lora_run,
    needs_critic,
    needs_reference,
    reference_from_actor,
    train_batch_size,
)
from roll.configs.schema import PipelineConfig
from roll.distributed.batch import Batch
from roll.distributed.cluster import RpcTimeoutError, WorkerDiedError, last_line
from roll.preflight import check_inputs
from roll.utils.checkpoint import CheckpointError, read_state, resolve_resume, save_checkpoint, sweep_partial
from roll.utils.tracking import make_tracker

log = logging.getLogger(__name__)


def pipeline_roles(cfg: PipelineConfig) -> list[str]:
    """The roles this run starts: the two actors, and the reference and critic when they are needed (a LoRA
    run's reference is actor_train with its adapter off, unless a reference role is configured)."""
    reference = needs_reference(cfg) and not reference_from_actor(cfg)
    return ["actor_train", "actor_infer"] + (["reference"] if reference else []) + (["critic"] if needs_critic(cfg) else [])


def preflight(cfg: PipelineConfig, roles: list[str], rollout_only: bool = False) -> None:
    """Checks that need this machine (not the config alone), run before Ray or any worker starts:
    each role's backend must be runnable here (a GPU backend on a machine without CUDA is one line,
    not a traceback from inside a worker)."""
    from roll.strategies.backends import check_backend

    for role in roles:
        check_backend(getattr(cfg, role).strategy_args.strategy_name, f"{role}.strategy_args.strategy_name")
    check_inputs(cfg, rollout_only)
    if async_ratio(cfg) and not rollout_only:
        _check_async_placement(cfg)


def _check_async_placement(cfg: PipelineConfig) -> None:
    """Rollouts ahead of training need actor_infer awake while the trainer works: on GPUs that means devices
    of its own (colocated roles take turns on a device)."""
    import torch

    from roll.configs.errors import ConfigError

    shared = set(cfg.actor_infer.device_mapping) & set(cfg.actor_train.device_mapping)
    if torch.cuda.is_available() and shared:
        raise ConfigError("async_generation_ratio", f"needs actor_infer on devices of its own; it shares {sorted(shared)} "
                          "with actor_train, and colocated roles take turns on a GPU")
    if not correction_of(cfg).active:
        log.warning("async_generation_ratio=%s without train_infer_correction: rows sampled by older weights enter "
                    "the loss without an importance weight (PPO's ratio is taken to the trainer's old log-probs)",
                    cfg.async_generation_ratio)


def old_logprobs_need_recompute(cfg: PipelineConfig, rows: int, has_reference: bool) -> bool:
    """Whether actor_train must compute old log-probs in a forward of their own. Not when the training
    forward gives the same numbers: one pass (ppo_epochs 1) of one optimizer step per rank, so every row's
    training forward runs on the weights before any update, and nothing needs the old log-probs before
    training (the reference KL does)."""
    if cfg.enable_old_logprobs_recompute or cfg.ppo_epochs != 1 or has_reference:
        return True
    ta = cfg.actor_train.training_args
    per_rank = -(-rows // data_parallel_size(cfg.actor_train))
    return per_rank > ta.per_device_train_batch_size * ta.gradient_accumulation_steps


def episode_length(cfg: PipelineConfig, mode: str) -> int:
    """Max tokens of one episode: sequence_length, or val_sequence_length for validation when set."""
    return int(cfg.val_sequence_length or cfg.sequence_length) if mode == "val" else int(cfg.sequence_length)


def correction_of(cfg: PipelineConfig) -> Correction:
    """The enabled parts of ``train_infer_correction``."""
    c = cfg.train_infer_correction
    rules = tuple(FilterRule(f.agg_type, f.ratio_enabled, f.ratio_low, f.ratio_high, f.diff_enabled, f.diff_low,
                             f.diff_high) for f in c.filters if f.enabled)
    w = c.is_weight
    return Correction(w.enabled, w.weight_type, w.upper_bound, w.detach, rules)


def apply_train_infer_correction(batch: Batch, correction: Correction) -> tuple[Batch, dict[str, float]]:
    """The batch with filtered tokens out of its response mask and the importance weight added (when
    enabled), and the gap metrics of the whole batch."""
    mask = batch["response_mask"]
    weight, keep, metrics = train_infer_correction(correction, mask, batch["old_logprobs"], batch["infer_logprobs"])
    update = {"response_mask": (mask * keep.to(mask.dtype))}
    if weight is not None:
        update["train_infer_is_weight"] = weight
    return Batch({**batch.tensors, **update}, batch.non_tensors, batch.meta), metrics


class AgenticPipeline:
    def __init__(self, cfg: PipelineConfig) -> None:
        self.roles = pipeline_roles(cfg)
        preflight(cfg, self.roles)
        self.cfg = cfg
        for folder in sweep_partial(cfg.output_dir):  # left by a run killed while it wrote a checkpoint
            log.warning("removed an unfinished checkpoint: %s", folder)
        self._init_run_state()
        self.clusters: dict[str, Any] = {}
        self._start_workers()
        self._start_rollouts()
        self.tracker = make_tracker(cfg.track_with, cfg.tracker_kwargs, cfg.logging_dir, cfg.exp_name)
        self.kl_ctl: FixedKLController | AdaptiveKLController = kl_controller(cfg.init_kl_coef, cfg.target_kl, cfg.kl_horizon)
        self.running: RunningMeanStd | None = None
        self.warned_singletons = False
        # a training batch is adjusted to a multiple of every training role's global mini-batch
        self.rows_per_step = math.lcm(*(global_train_batch_size(getattr(cfg, r)) for r in ("actor_train", "critic")
                                        if r in self.clusters))
        self.start_step = 0
        self._resume()

    # --- set-up (one call each)
    def _init_run_state(self) -> None:
        self.origin = time.perf_counter()  # phase timestamps in the metrics count from here
        self.version = -1  # the policy version on the inference side: the step of the last weight sync
        self._side = ThreadPoolExecutor(max_workers=1, thread_name_prefix="validation")  # validation beside rollouts

    def _start_workers(self) -> None:
        import ray
        import torch

        from roll.distributed.cluster import Cluster
        from roll.distributed.resources import (
            ResourceManager,
            alive_nodes,
            check_nodes_fit,
            device_nodes,
            ray_init,
        )
        from roll.workers import DEFAULT_WORKERS

        cfg = self.cfg
        roles = self.roles
        devices = sorted({d for r in roles for d in getattr(cfg, r).device_mapping})
        use_gpu = torch.cuda.is_available()
        ray_init(num_cpus=None if use_gpu else max(os.cpu_count() or 1, 1), object_store_mb=int(os.environ.get("ROLL_OBJECT_STORE_MB", "1024")))
        # devices must exist before placement groups ask for them (Ray would wait for them forever)
        nodes = device_nodes(alive_nodes(), ray.get_runtime_context().get_node_id())
        check_nodes_fit({r: getattr(cfg, r).device_mapping for r in roles}, cfg.num_gpus_per_node,
                        [n.devices for n in nodes])
        self.resources = ResourceManager(devices, cfg.num_gpus_per_node, use_gpu=use_gpu, nodes=nodes)
        colocated = max(sum(d in getattr(cfg, r).device_mapping for r in roles) for d in devices)
        self.colocated_roles = sorted(r for r in roles if any(
            set(getattr(cfg, r).device_mapping) & set(getattr(cfg, o).device_mapping) for o in roles if o != r))
        settings = {
            "seed": cfg.seed, "max_grad_norm": cfg.max_grad_norm, "system_envs": cfg.system_envs,
            # train_step calls each training role gets; its LR schedule spans the optimizer steps they take
            "train_calls": {"actor_train": max(1, cfg.max_steps - cfg.critic_warmup), "critic": cfg.max_steps},
            # colocated roles take turns (one phase at a time), so each may use every core
            "threads_per_worker": os.cpu_count() or 1,
            "colocated_roles": self.colocated_roles,
            "sequence_length": cfg.sequence_length,
            # engines that apply LoRA adapters size their adapter slots by the trainer's rank
            "lora_rank": cfg.actor_train.model_args.lora_rank if lora_run(cfg) else None,
        }
        for role in roles:
            worker = getattr(cfg, role)
            cls = import_path(worker.worker_cls, "worker") if worker.worker_cls else DEFAULT_WORKERS[role]
            log.info("starting %s: %d worker(s) on devices %s", role, worker.world_size, worker.device_mapping)
            self.clusters[role] = Cluster(role, cls, worker, self.resources, settings, rpc_timeout=cfg.rpc_timeout)
        for role in roles:  # one role at a time: colocated model loads do not compete for memory
            self.clusters[role].call("initialize")
        # On GPUs, colocated roles take turns: before each phase the others free their device memory
        # (vLLM sleep, SGLang release, training state to CPU). On CPU there is nothing to free.
        self.time_share = use_gpu and bool(self.colocated_roles)
        self.resident = set(roles)
        log.info("workers ready (%d roles, up to %d colocated per device)", len(roles), colocated)
        for role in roles:  # where each role runs, once
            log.info("placement: %s ranks on %s", role, ", ".join(self.clusters[role].where))
        self.placement_metrics = {f"placement/{role}_node": float(self.clusters[role].nodes[0]) for role in roles}

    def _start_rollouts(self) -> None:
        import ray
        from transformers import AutoTokenizer

        from roll.agentic.generation import GenerationServer
        from roll.models.resolve import ensure_hf_folder

        cfg = self.cfg
        margs = cfg.actor_infer.model_args
        tokenizer_path = ensure_hf_folder(margs.model_name_or_path, margs.gguf_file)
        self.template = ChatTemplate(AutoTokenizer.from_pretrained(tokenizer_path), tokenizer_path)
        self.template.check_prefix_preserving()
        infer = self.clusters["actor_infer"]
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # on the driver's node: the run ends with that node anyway, so a lost worker node never takes it along
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        self.server = ray.remote(GenerationServer).options(max_concurrency=4096, num_cpus=0.0001,
                                                           scheduling_strategy=here).remote(
            infer.workers, cfg.max_running_requests, 0.02)

        def take_stats() -> dict[str, float]:
            return ray.get(self.server.take_stats.remote())

        def factory_for(em: Any, sequence_length: int):
            host = import_path(em.worker_cls, "env_manager_worker") if em.worker_cls else EnvManagerHost

            def make(params: Any, keep_frames: bool):
                return ray_factory(host, tokenizer_path, params, sequence_length, keep_frames, self.server,
                                   {**cfg.system_envs, **em.system_envs}, cfg.deterministic, EpisodeLimits.of(em),
                                   cfg.rpc_timeout)

            return make

        train_factory = factory_for(cfg.train_env_manager, episode_length(cfg, "train"))
        self.train_rollout = make_rollout(cfg, "train", self.template, train_factory, take_stats)
        validation = cfg.eval_steps > 0 and cfg.val_batch_size > 0 and "actor_train" in self.roles
        val_factory = factory_for(cfg.val_env_manager, episode_length(cfg, "val"))
        self.val_rollout = (make_rollout(cfg, "val", self.template, val_factory, take_stats, render=False)
                            if validation else None)
        # random moves and the env's solver on exactly the validation episodes (fixed seeds): logged once
        self.baselines = baseline_metrics(self.val_rollout.requests(0), seed=cfg.seed) if validation else {}

    def _resume(self) -> None:
        # preflight already checked this checkpoint against its manifest; hashing it again is not needed
        path = resolve_resume(self.cfg.resume_from_checkpoint, self.cfg.output_dir, verify=False)
        if path is None:
            return
        state = read_state(path)
        for role in ("actor_train", "critic"):
            if role in self.clusters:
                try:
                    self.clusters[role].call("load_checkpoint", str(path / role))
                except (WorkerDiedError, RpcTimeoutError):
                    raise
                except Exception as e:  # files that match the manifest yet do not load (edited consistently)
                    raise CheckpointError(f"{path / role}: cannot be loaded: {last_line(e)}") from None
        self.start_step = int(state["step"]) + 1
        self.version = int(state.get("version", state["step"]))  # the weights saved: the next sync makes it start_step
        kl = state.get("kl_coef")
        if kl is not None:
            self.kl_ctl = type(self.kl_ctl)(**{**self.kl_ctl.__dict__, "value": kl})
        if state.get("running"):
            self.running = RunningMeanStd(**state["running"])
        log.info("resumed from %s: continuing at step %d", path, self.start_step)

    # --- the loop
    def run(self) -> dict[str, float]:
        cfg = self.cfg
        last: dict[str, float] = {}
        steps = range(self.start_step, cfg.max_steps)
        bar = _progress(len(steps), self.start_step)
        ratio = async_ratio(cfg)
        rollouts = (RolloutsAhead(self._collect_train, self.start_step, cfg.max_steps, ratio) if ratio
                    else RolloutsNow(self._collect_train))
        try:
            for step in steps:
                last = self.step(step, rollouts, ratio, bar)
        except Exception as e:
            lost = self.lost_worker()  # a node that died shows first as a failed rollout or call: name it
            if lost is not None:
                raise WorkerDiedError(lost) from e
            raise
        finally:
            rollouts.stop()
            bar.close()
            self.tracker.close()  # what was logged reaches its files whatever stopped the run
        return last

    def lost_worker(self) -> str | None:
        """One line naming the first role worker that is gone and its node, or None when all answer."""
        for role, cluster in self.clusters.items():
            dead = cluster.dead_ranks()
            if dead:
                return f"{role} rank {dead[0]} on {cluster.where[dead[0]]} is gone (its process or node died)"
        return None

    def step(self, step: int, rollouts: RolloutsNow | RolloutsAhead, ratio: int, bar: Any) -> dict[str, float]:
        """One training step; returns its metrics."""
        cfg = self.cfg
        metrics: dict[str, float] = {}
        timer = _Timer(metrics, bar, self.origin)
        step_start = time.perf_counter()
        if step == self.start_step or step % cfg.actor_train.model_update_frequency == 0:
            with timer("weight_sync"):
                self.devices_to("actor_train")  # actor_infer wakes its weights itself to receive them
                metrics.update(self.sync_weights(version=step))
        rollouts.trainer_at(step)  # async: the batches of steps up to step + ratio may now be collected
        validation = None
        if self.val_rollout is not None and step % cfg.eval_steps == 0:  # alongside the training rollout
            validation = self._side.submit(self.collect, "val", cfg.val_batch_size, step)
        with timer("rollout"):
            self.devices_to("actor_infer")
            rollout = rollouts.take(step)  # sync: played now; async: played ahead, at most `ratio` versions old
        batch = rollout.batch
        metrics.update(rollout.metrics)
        if ratio:  # groups with a token sampled more than `ratio` versions ago are dropped (and counted)
            batch, stale_metrics = bound_staleness(batch, self.version, ratio)
            metrics.update(stale_metrics)
        # whole optimizer steps for every training role (batch_adjust_mode); added/removed rows are counted
        batch, adjust_metrics = adjust_batch(batch, cfg.batch_adjust_mode, self.rows_per_step,
                                             np.random.default_rng([cfg.seed, step]))
        metrics.update(adjust_metrics)
        if validation is not None:
            with timer("eval"):  # only the part the training rollout did not cover
                metrics.update(validation.result().metrics)
        if "reference" in self.clusters:
            with timer("reference"):
                self.devices_to("reference")
                batch = batch | self.clusters["reference"].dispatch("compute_log_probs", batch)
        elif reference_from_actor(cfg):
            with timer("reference"):  # LoRA: the base model is the adapter-free actor
                self.devices_to("actor_train")
                batch = batch | self.clusters["actor_train"].dispatch("compute_ref_log_probs", batch)
        recompute = old_logprobs_need_recompute(cfg, len(batch), needs_reference(cfg))
        metrics["actor/old_logprobs_recomputed"] = float(recompute)
        if recompute:
            with timer("old_log_probs"):
                self.devices_to("actor_train")
                batch = batch | self.clusters["actor_train"].dispatch("compute_log_probs", batch)
        if "critic" in self.clusters:
            with timer("values"):
                self.devices_to("critic")
                batch = batch | self.clusters["critic"].dispatch("compute_values", batch)
        with timer("advantages"):
            batch, adv_metrics, self.running = compute_batch_advantages(batch, cfg, self.kl_ctl.value, self.running)
            metrics.update(adv_metrics)
            self.kl_ctl = self.kl_ctl.update(adv_metrics.get("actor/kl_to_reference", 0.0), len(batch))
            self._warn_singleton_groups(adv_metrics)
        if recompute and "infer_logprobs" in batch:
            # With old log-probs of their own, the gap to the sampler's is measured (and corrected) on the
            # whole batch here; otherwise the actor's loss does it on its first forward.
            batch, gap_metrics = apply_train_infer_correction(batch, correction_of(cfg))
            metrics.update(gap_metrics)
        critic_update = None
        if "critic" in self.clusters:
            with timer("critic_train"):
                self.devices_to("critic")
                critic_update = self.clusters["critic"].dispatch_async(
                    "train_step", batch, cfg.value_clip, cfg.loss_agg_mode, cfg.ppo_epochs, cfg.sequence_length)
                if self.shares_devices("critic", "actor_train"):  # colocated on GPUs: one after the other
                    metrics.update(critic_update.result()[0])
        if step >= cfg.critic_warmup:
            with timer("actor_train"):
                self.devices_to("actor_train")
                # every replica reports the metrics of the whole global batch (reduced over ranks)
                metrics.update(self.clusters["actor_train"].dispatch("train_step", batch, self.loss_config(), cfg.ppo_epochs)[0])
        if critic_update is not None:  # on devices of its own, the critic trained alongside the actor
            with timer("critic_train"):
                metrics.update(critic_update.result()[0])
        if cfg.save_steps and ((step + 1) % cfg.save_steps == 0 or step + 1 == cfg.max_steps):
            with timer("checkpoint"):
                self.save(step)
        metrics.update(self._throughput(batch, metrics, time.perf_counter() - step_start))
        return self._end_step(step, metrics, rollout.trajectories, bar)

    def _end_step(self, step: int, metrics: dict[str, float], trajectories: list[Any], bar: Any) -> dict[str, float]:
        """Log the step (every logging_steps, and the last one) and move the progress bar."""
        if step == self.start_step:  # logged once: where each role runs, the baselines of validation
            metrics.update({**self.placement_metrics, **self.baselines})
        if step % self.cfg.logging_steps == 0 or step + 1 == self.cfg.max_steps:
            self.tracker.log(metrics, step)
            self._log_episode(trajectories, step)
        bar.update(1)
        return metrics

    # --- pieces
    def collect(self, mode: str, n: int, step: int) -> RolloutResult:
        """A rollout of ``n`` trajectories: played by the envs, or replayed from a dump (rollout_mock: mock);
        dumped for replay (rollout_mock: dump) and as readable rows (rollout_dump_dir) when asked."""
        cfg = self.cfg
        mock = cfg.rollout_mock if cfg.rollout_mock is not None and cfg.rollout_mock.enable else None
        if mock is not None and mock.mode == "mock":
            batch, metrics = load_rollout(mock.dump_dir, mode, step)
            return RolloutResult(batch, {**metrics, f"{mode}/replayed": 1.0}, [])
        began = time.perf_counter() - self.origin
        result = (self.train_rollout if mode == "train" else self.val_rollout).collect(n, step)
        result.metrics[f"time/{mode}_began_s"] = began  # when it ran (overlap with training is visible)
        result.metrics[f"time/{mode}_ended_s"] = time.perf_counter() - self.origin
        if mock is not None:
            save_rollout(mock.dump_dir, mode, step, result.batch, result.metrics)
        if cfg.rollout_dump_dir:
            write_rows(cfg.rollout_dump_dir, mode, step, result.batch, self.template.decode)
        return result

    def _log_episode(self, trajectories: list[Any], step: int) -> None:
        """One sampled training episode (the step's first) to the tracker: transcript and frames."""
        if not trajectories:
            return
        t = trajectories[0]
        name = f"episode/{t.request.slot.tag}"
        text = transcript(f"step {step}, env {t.request.slot.env_id}", t.messages, t.turn_rewards, t.metrics)
        self.tracker.log_episode(name, text, filmstrip(t.frames) if t.frames else None, step)

    def shares_devices(self, role: str, other: str) -> bool:
        """Whether the two roles take turns on a device (GPUs only; CPU slots run side by side)."""
        return self.time_share and bool(set(getattr(self.cfg, role).device_mapping) & set(getattr(self.cfg, other).device_mapping))

    def devices_to(self, role: str) -> None:
        """Make ``role`` resident on its devices, freeing the colocated roles' memory first."""
        if not self.time_share or role not in self.clusters:
            return
        mine = set(getattr(self.cfg, role).device_mapping)
        for other in self.colocated_roles:
            if other != role and other in self.resident and mine & set(getattr(self.cfg, other).device_mapping):
                self.clusters[other].call("offload")
                self.resident.discard(other)
        if role not in self.resident:
            self.clusters[role].call("reload")
            self.resident.add(role)

    def sync_weights(self, version: int) -> dict[str, float]:
        """actor_train's weights to actor_infer, between generation batches: generation pauses (the batches
        running finish first), the weights move, and generation resumes stamped with ``version``."""
        import ray

        ray.get(self.server.pause.remote())
        try:
            stats = self.clusters["actor_train"].call("sync_weights", self.clusters["actor_infer"].workers)
            if self.cfg.verify_weight_sync:  # while generation is paused: the engines hold exactly these weights
                stats[0].update(self.verify_sync())
        finally:
            ray.get(self.server.resume.remote(version))
        self.version = version
        return {**stats[0], "async/version": float(version)}

    def verify_sync(self) -> dict[str, float]:
        """Every engine and the trainer score the same probe sequences; their gap is logged, and a gap beyond
        what the precisions allow stops the run (``verify_weight_sync``)."""
        cfg = self.cfg
        probe = probe_batch(self.template.tokenizer)
        engines = [b["infer_logprobs"] for b in self.clusters["actor_infer"].call("compute_log_probs", probe)]
        train = self.clusters["actor_train"].dispatch("compute_log_probs", probe)["old_logprobs"]
        fp32 = (cfg.actor_infer.model_args.dtype == "fp32" and cfg.actor_train.model_args.dtype == "fp32"
                and not cfg.actor_train.training_args.bf16)
        gap = sync_gap(train, engines, probe["attention_mask"], fp32)
        if not gap.ok:
            raise RuntimeError(f"weight sync check: actor_infer's log-probs differ from actor_train's by up to "
                               f"{gap.max_abs:.3g} (mean {gap.mean_abs:.3g}) on the probe text, beyond a "
                               f"{gap.describe()}: the engines do not hold the trainer's weights")
        return gap.metrics()

    def _collect_train(self, step: int) -> RolloutResult:
        return self.collect("train", train_batch_size(self.cfg), step)

    def loss_config(self) -> ActorLossConfig:
        cfg = self.cfg
        low, high = (cfg.pg_clip_low, cfg.pg_clip_high) if cfg.use_pg_clip_range else (cfg.pg_clip, cfg.pg_clip)
        return ActorLossConfig(
            pg_clip_low=low, pg_clip_high=high, dual_clip=dual_clip_constant(cfg) if cfg.dual_clip_loss else None,
            use_topr_loss=cfg.use_topr_loss, topr_positive_weight=cfg.actor_train.topr_positive_weight,
            topr_negative_weight=cfg.actor_train.topr_negative_weight, rl_loss_coef=cfg.rl_loss_coef,
            use_kl_loss=cfg.use_kl_loss, kl_loss_coef=cfg.kl_loss_coef, kl_loss_type=cfg.kl_loss_type,
            entropy_loss_coef=cfg.entropy_loss_coef, sft_loss_coef=cfg.sft_loss_coef, agg_mode=cfg.loss_agg_mode,
            norm_length=float(cfg.sequence_length), ratio_type=cfg.ratio_type,
            pg_variant=effective_pg_variant(cfg), correction=correction_of(cfg),
        )

    def _warn_singleton_groups(self, metrics: dict[str, float]) -> None:
        share = metrics.get("reward/singleton_group_share", 0.0)
        if share > 0.5 and not self.warned_singletons:
            self.warned_singletons = True
            log.warning("%.0f%% of the reward-normalisation groups hold a single row: their normalised reward is 0 and "
                        "they teach nothing (reward_normalization.grouping=%s; a group needs group_size > 1)",
                        100 * share, self.cfg.reward_normalization.grouping)

    def save(self, step: int) -> None:
        def parts(folder: Any) -> None:
            for role in ("actor_train", "critic"):
                if role in self.clusters:
                    self.clusters[role].call("save_checkpoint", str(folder / role))

        state = {"seed": self.cfg.seed, "kl_coef": self.kl_ctl.value, "version": self.version,
                 "running": self.running.__dict__ if self.running else None}
        path = save_checkpoint(self.cfg.output_dir, step, parts, state, keep=self.cfg.max_ckpt_to_keep)
        log.info("checkpoint written: %s", path)

    def _throughput(self, batch: Batch, metrics: dict[str, float], step_time: float) -> dict[str, float]:
        tokens = float(batch["attention_mask"].sum())
        out = {"time/step": step_time, "tokens/train_per_s": tokens / max(metrics.get("time/actor_train", 0.0), 1e-9),
               "tokens/step": tokens}
        out["time/overhead_share"] = 1.0 - sum(metrics.get(f"time/{k}", 0.0) for k in (
            "rollout", "eval", "reference", "old_log_probs", "values", "critic_train", "actor_train")) / max(step_time, 1e-9)
        return out

    def shutdown(self) -> None:
        import ray

        self._side.shutdown(wait=False, cancel_futures=True)
        for c in self.clusters.values():
            c.shutdown()
        # A worker interrupted while saving finishes that save before it is stopped, into the .partial folder the
        # driver already removed (recreating it); with every worker stopped nothing writes any more.
        sweep_partial(self.cfg.output_dir)
        with contextlib.suppress(Exception):
            self.resources.shutdown()
        ray.shutdown()


class _Timer:
    """``with timer("phase"):`` records time/<phase> (and when it began and ended, counted from ``origin``)
    and shows the phase on the progress bar."""

    def __init__(self, metrics: dict[str, float], bar: Any, origin: float = 0.0) -> None:
        self.metrics, self.bar, self.origin = metrics, bar, origin

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        self.bar.set_postfix_str(phase)
        log.info("phase: %s", phase)
        start = time.perf_counter()
        yield
        end = time.perf_counter()
        self.metrics[f"time/{phase}"] = self.metrics.get(f"time/{phase}", 0.0) + end - start
        if self.origin:
            self.metrics.setdefault(f"time/{phase}_began_s", start - self.origin)
            self.metrics[f"time/{phase}_ended_s"] = end - self.origin


def _progress(total: int, start: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, initial=0, desc=f"steps from {start}", unit="step", dynamic_ncols=True)


__all__ = ["AgenticPipeline"]
