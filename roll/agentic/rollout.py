"""The rollout scheduler: env groups x the inference workers -> a training Batch.

``num_env_groups`` groups of ``group_size`` envs are split over ``tags`` by
``num_groups_partition``; every env of a group gets the same config and, per episode, the same
seed (a GRPO group). Env managers run concurrently (threads in-process, or Ray actors each hosting
``max_env_num_per_worker`` envs) and send generation requests to one dynamic batcher in front of
the inference workers. ``collect(n)`` runs ``max_traj_per_env`` episodes per env and returns whole
groups until ``n`` trajectories, with per-tag metrics.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from roll.agentic.conversation import ChatTemplate
from roll.agentic.env_managers.base import (
    EnvError,
    EnvSlot,
    EpisodeCrash,
    EpisodeLimits,
    EpisodeRequest,
    Trajectory,
)
from roll.agentic.env_monitor import ActiveEpisode, ActivityMonitor
from roll.agentic.render import write_trajectory
from roll.algorithms.intervals import wilson_interval
from roll.configs.shipped import TRAJ_MANAGER, roll_class
from roll.distributed.batch import Batch
from roll.strategies.base import SamplingParams

log = logging.getLogger(__name__)

DEFAULT_MANAGER = TRAJ_MANAGER


def import_path(path: str, kind: str) -> Any:
    """The class at ``path`` (ROLL's path of a class we implement maps to ours), derived from the base of its
    ``kind`` (``roll.preflight.class_bases``)."""
    from envs.registration import load_entry_point
    from roll.preflight import class_bases

    return load_entry_point(roll_class(path), class_bases(kind))


def build_slots(custom_envs: dict[str, Any], em: Any, seed: int = 0) -> list[EnvSlot]:
    """Env slots of an env-manager config: groups split over tags, group_size (+ group_size_redundancy)
    envs per group. An ``env_config`` with a ``seed`` key gets ``seed`` + the group's index there (ROLL's
    group seed), so each group's env draws from its own stream (a GEM reasoning-gym set, ...)."""
    slots, group = [], 0
    for tag, n_groups in zip(em.tags, em.num_groups_partition):
        entry = custom_envs[tag]
        entry = dataclasses.asdict(entry) if dataclasses.is_dataclass(entry) else dict(entry)
        env_config = dict(entry.get("env_config") or {})
        if em.format_penalty and "format_penalty" not in env_config:
            env_config["format_penalty"] = em.format_penalty  # the manager's penalty is the default for its envs
        entry["env_config"] = env_config
        for _ in range(n_groups):
            group_entry = entry
            if "seed" in env_config:
                group_entry = {**entry, "env_config": {**env_config, "seed": int(seed) + group}}
            for _ in range(em.group_size + em.group_size_redundancy):
                slots.append(EnvSlot(len(slots), group, tag, group_entry))
            group += 1
    return slots


def share_step_limits(placement: list[tuple[str, list[EnvSlot]]]) -> list[tuple[str, list[EnvSlot]]]:
    """Each manager's part of its tags' ``max_env_step_concurrent``: in proportion to the envs of the tag it
    hosts, at least 1, so the managers together never run more env calls of a tag at once than the limit
    (while there are no more managers than the limit)."""
    totals: dict[str, int] = {}
    for _, part in placement:
        for slot in part:
            totals[slot.tag] = totals.get(slot.tag, 0) + 1
    out = []
    for cls_path, part in placement:
        here: dict[str, int] = {}
        for slot in part:
            here[slot.tag] = here.get(slot.tag, 0) + 1
        shared = []
        for slot in part:
            limit = int(slot.entry.get("max_env_step_concurrent") or 0)
            if limit > 0 and here[slot.tag] < totals[slot.tag]:
                share = max(1, limit * here[slot.tag] // totals[slot.tag])
                slot = dataclasses.replace(slot, entry={**slot.entry, "max_env_step_concurrent": share})
            shared.append(slot)
        out.append((cls_path, shared))
    return out


def _actor_died(e: BaseException) -> bool:
    """The manager actor or its node is gone: the actor died, or its answer was lost with its node's object store."""
    try:
        import ray
    except ImportError:
        return False
    return isinstance(e, (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.NodeDiedError))


class RolloutFailure(RuntimeError):
    """Too few episodes survived a collection to train on."""


def episode_requests(slots: list[EnvSlot], per_env: int, seed: int, name: str, step: int, fixed_seeds: bool) -> list[EpisodeRequest]:
    """The episodes a rollout plays at ``step``: ``per_env`` (max_traj_per_env) per env; the envs of a group
    share each episode's seed. With ``fixed_seeds`` (validation) every collection plays the same
    episodes, so the curve over steps measures the policy, not the luck of the levels; the seeds follow
    only from ``seed``, so a resumed run keeps them."""
    seed_step = 0 if fixed_seeds else step
    return [EpisodeRequest(slot, mix_seed(seed, name, seed_step, slot.group_id, k), k)
            for k in range(per_env) for slot in slots]


def mix_seed(*parts: Any) -> int:
    """A stable 31-bit seed from parts (same value in every process and run)."""
    return zlib.crc32(":".join(map(str, parts)).encode()) & 0x7FFFFFFF


@dataclass
class RolloutResult:
    batch: Batch
    metrics: dict[str, float]
    trajectories: list[Trajectory]


ManagerFactory = Callable[[str, list[EnvSlot]], Any]  # (class path, slots) -> object with .run(requests)


class RolloutScheduler:
    def __init__(
        self,
        *,
        name: str,
        slots: list[EnvSlot],
        em_config: Any,
        template: ChatTemplate,
        factory: ManagerFactory,
        seed: int,
        render_dir: str | None = None,
        render_count: int = 4,
        take_generation_stats: Callable[[], dict[str, float]] | None = None,
        fixed_seeds: bool = False,
        monitor: Any = None,
        group_filter: Any = None,
    ) -> None:
        self.name = name
        self.group_filter = group_filter  # group_filter_cls's instance; None keeps every group
        self.monitor = monitor  # env_monitor settings (enable, monitor_interval, hung_timeout); None: off
        self.fixed_seeds = fixed_seeds
        self.slots = slots
        self.em = em_config
        self.template = template
        self.seed = seed
        self.render_dir = Path(render_dir) if render_dir else None
        self.render_count = render_count
        self.take_generation_stats = take_generation_stats
        per_host = self.em.max_env_num_per_worker or len(slots) or 1
        self.factory = factory
        self.placement: list[tuple[str, list[EnvSlot]]] = []  # (manager class, its slots), one per manager
        for cls_path, group_slots in self._by_manager().items():
            for start in range(0, len(group_slots), per_host):  # max_env_num_per_worker envs per manager
                self.placement.append((cls_path, group_slots[start:start + per_host]))
        self.placement = share_step_limits(self.placement)
        self.managers = [factory(cls_path, part) for cls_path, part in self.placement]
        grans = {m.granularity for m in self.managers}
        if len(grans) > 1:
            raise ValueError(f"{name}: cannot mix trajectory-wise and step-wise env managers in one rollout")
        self.granularity = grans.pop() if grans else "trajectory"

    def _by_manager(self) -> dict[str, list[EnvSlot]]:
        out: dict[str, list[EnvSlot]] = {}
        for slot in self.slots:
            path = slot.entry.get("env_manager_cls") or self.em.env_manager_cls or DEFAULT_MANAGER
            out.setdefault(path, []).append(slot)
        return out

    def requests(self, step: int) -> list[EpisodeRequest]:
        return episode_requests(self.slots, self.em.max_traj_per_env, self.seed, self.name, step, self.fixed_seeds)

    def collect(self, n: int, step: int = 0) -> RolloutResult:
        start = time.perf_counter()
        with self._activity_monitor() as monitor:
            scheduled, errors = self._run_all(self.requests(step))
            trajectories, dropped, kept = self._filter_groups(scheduled, errors, step)
        wall = time.perf_counter() - start
        self._check_healthy(trajectories, errors, n)
        chosen, incomplete, redundant = self._whole_groups(trajectories, n)
        batch = self.to_batch(chosen, step)
        # scores are of the step's scheduled levels (before any replay), so curves compare with and without a filter
        played, _, _ = self._whole_groups(scheduled, n) if self.group_filter is not None else (chosen, 0, 0)
        metrics = self._metrics(played, errors, incomplete, wall)
        metrics[f"{self.name}/redundant_left_out"] = float(redundant)
        if self.group_filter is not None:
            metrics[f"{self.name}/groups_filtered"] = float(dropped)
            metrics[f"{self.name}/groups_kept_after_resamples"] = float(kept)
            metrics[f"{self.name}/trained_score"] = float(np.mean([t.score for t in chosen])) if chosen else 0.0
        metrics[f"{self.name}/env_hung_reports"] = float(monitor.reports)
        if self.render_dir is not None:
            self._render(chosen, step)
        return RolloutResult(batch, metrics, chosen)

    def _run_all(self, requests: list[EpisodeRequest]) -> tuple[list[Trajectory], list[EnvError]]:
        """Every request, each on the manager that hosts its env (managers in parallel)."""
        if len(self.managers) == 1:
            return self._run_manager(0, requests)
        from concurrent.futures import ThreadPoolExecutor

        trajectories: list[Trajectory] = []
        errors: list[EnvError] = []
        ids = [{s.env_id for s in part} for _, part in self.placement]
        with ThreadPoolExecutor(len(self.managers)) as pool:
            parts = pool.map(lambda i: self._run_manager(i, [r for r in requests if r.slot.env_id in ids[i]]),
                             range(len(self.managers)))
            for t, e in parts:
                trajectories += t
                errors += e
        return trajectories, errors

    def _filter_groups(self, trajectories: list[Trajectory], errors: list[EnvError],
                       step: int) -> tuple[list[Trajectory], int, int]:
        """Complete groups the group filter drops are played again on a fresh level, at most
        group_filter_max_resamples times. Returns (trajectories, groups dropped, groups kept at the limit)."""
        if self.group_filter is None:
            return trajectories, 0, 0
        size = self.em.group_size
        limit = int(getattr(self.em, "group_filter_max_resamples", 0))
        seed_step = 0 if self.fixed_seeds else step
        pending = None  # group keys to ask about: all at first, then only the replayed ones
        dropped = 0
        for replay in range(1, limit + 2):
            groups: dict[tuple[int, int], list[Trajectory]] = {}
            for t in trajectories:
                groups.setdefault((t.request.episode, t.request.slot.group_id), []).append(t)
            asked = [k for k in sorted(groups) if (pending is None or k in pending) and len(groups[k]) >= size]
            drop = {k for k in asked if self.group_filter.filter(k[1], k[0],
                                                                 sorted(groups[k], key=lambda t: t.request.slot.env_id)[:size])}
            if not drop:
                return trajectories, dropped, 0
            if replay > limit:
                return trajectories, dropped, len(drop)
            dropped += len(drop)
            trajectories = [t for t in trajectories if (t.request.episode, t.request.slot.group_id) not in drop]
            requests = [EpisodeRequest(slot, mix_seed(self.seed, self.name, seed_step, group, episode, "replay", replay),
                                       episode)
                        for episode, group in sorted(drop) for slot in self.slots if slot.group_id == group]
            more, errs = self._run_all(requests)
            trajectories += more
            errors += errs
            pending = drop
        return trajectories, dropped, 0

    def _activity_monitor(self) -> ActivityMonitor:
        """The env monitor of one collection (interval 0: off). Managers without an activity record (a custom
        worker_cls may lack one) are left out."""
        m = self.monitor
        on = m is not None and m.enable
        sources = [(lambda i=i: self.managers[i].activity_snapshot()) for i, mgr in enumerate(self.managers)
                   if hasattr(mgr, "activity_snapshot")]
        return ActivityMonitor(self.name, sources, float(m.monitor_interval) if on else 0.0,
                               float(m.hung_timeout) if on else 0.0)

    def _run_manager(self, index: int, requests: list[EpisodeRequest]) -> tuple[list[Trajectory], list[EnvError]]:
        """One manager's episodes. A manager actor that died is re-created for the next collection; its
        episodes of this one are counted as env errors, not lost silently."""
        try:
            return self.managers[index].run(requests)
        except Exception as e:
            if not _actor_died(e):
                raise
            cls_path, part = self.placement[index]
            tags = ", ".join(sorted({s.tag for s in part}))
            log.warning("%s: the env manager of %s (envs %d-%d) died (%s); re-creating it, its %d episodes are lost",
                        self.name, tags, part[0].env_id, part[-1].env_id, type(e).__name__, len(requests))
            self.managers[index] = self._recreate(cls_path, part)
            return [], [EnvError(r, f"env manager died: {type(e).__name__}") for r in requests]

    def _recreate(self, cls_path: str, part: list[EnvSlot], attempts: int = 5) -> Any:
        """A new manager for ``part``. Ray may still count a node that just died as alive, so a manager placed
        there dies at once; the next attempt goes to the next node (the factory takes them in turn)."""
        for _ in range(attempts - 1):
            try:
                return self.factory(cls_path, part)
            except Exception as e:
                if not _actor_died(e):
                    raise
                log.warning("%s: a new env manager for envs %d-%d died as it started (%s); trying again",
                            self.name, part[0].env_id, part[-1].env_id, type(e).__name__)
                time.sleep(1.0)
        return self.factory(cls_path, part)

    def _check_healthy(self, trajectories: list[Trajectory], errors: list[EnvError], n: int) -> None:
        """Stop with one line when too few episodes survived (never a failure deep in a tensor op)."""
        floor = max(1.0, float(getattr(self.em, "min_healthy_share", 0.0)) * n)
        if len(trajectories) >= floor:
            return
        if errors:
            first = errors[0]
            why = (f"{first.request.slot.tag} (env {first.request.slot.env_id}, seed {first.request.seed}): "
                   f"{first.message[:300]}")
        else:
            why = "no env produced an episode"
        raise RolloutFailure(f"{self.name}: {len(trajectories)} of {n} episodes survived "
                             f"(min_healthy_share {getattr(self.em, 'min_healthy_share', 0.0)}); first error: {why}")

    def _whole_groups(self, trajectories: list[Trajectory], n: int) -> tuple[list[Trajectory], int, int]:
        """Up to ``n`` trajectories in whole groups of group_size (complete groups first); a group with
        redundant envs keeps its lowest-numbered finished episodes. Returns (chosen, partial groups used,
        redundant episodes left out)."""
        groups: dict[tuple[int, int], list[Trajectory]] = {}
        for t in trajectories:
            groups.setdefault((t.request.episode, t.request.slot.group_id), []).append(t)
        size = self.em.group_size
        complete = [k for k in sorted(groups) if len(groups[k]) >= size]
        partial = [k for k in sorted(groups) if len(groups[k]) < size]
        chosen: list[Trajectory] = []
        used_partial = 0
        for key in complete + partial:  # whole groups first; partial ones only when short
            if len(chosen) >= n:
                break
            used_partial += key in partial
            chosen += sorted(groups[key], key=lambda t: t.request.slot.env_id)[:size]
        redundant = sum(max(0, len(g) - size) for g in groups.values())
        return chosen, used_partial, redundant

    # --- rows
    def group_key(self, t: Trajectory, step: int) -> str:
        return f"{self.name}-{step}-g{t.request.slot.group_id}-e{t.request.episode}"

    def to_batch(self, trajectories: list[Trajectory], step: int) -> Batch:
        if self.granularity == "step":
            return self._step_batch(trajectories, step)
        rows = [t.row for t in trajectories]
        batch = _pad_rows(rows, self.template.tokenizer.pad_token_id)
        k = max((len(t.turn_rewards) for t in trajectories), default=1) or 1
        turn_rewards = torch.zeros(len(trajectories), k)
        for i, t in enumerate(trajectories):
            turn_rewards[i, : len(t.turn_rewards)] = torch.tensor(t.turn_rewards, dtype=torch.float32)
        tensors = {"scores": torch.tensor([t.score for t in trajectories], dtype=torch.float32), "turn_rewards": turn_rewards}
        return batch | Batch(tensors, self._non_tensors(trajectories, step))

    def _step_batch(self, trajectories: list[Trajectory], step: int) -> Batch:
        rows, owners, records = [], [], []
        for t in trajectories:
            for rec in t.steps:
                rows.append(rec.row)
                owners.append(t)
                records.append(rec)
        batch = _pad_rows(rows, self.template.tokenizer.pad_token_id)
        tensors = {
            "scores": torch.tensor([t.score for t in owners], dtype=torch.float32),
            "step_rewards": torch.tensor([r.reward for r in records], dtype=torch.float32),
            "step_idx": torch.tensor([r.step_idx for r in records], dtype=torch.long),
        }
        non = self._non_tensors(owners, step)
        non["state_hash"] = [r.state_hash for r in records]
        return batch | Batch(tensors, non)

    def _non_tensors(self, trajectories: list[Trajectory], step: int) -> dict[str, list]:
        return {
            "traj_id": [f"{self.group_key(t, step)}-env{t.request.slot.env_id}" for t in trajectories],
            "traj_group_id": [self.group_key(t, step) for t in trajectories],
            "tags": [t.request.slot.tag for t in trajectories],
            "env_id": [t.request.slot.env_id for t in trajectories],
            "episode_scores": [t.score for t in trajectories],
            "step_scores": [list(t.turn_rewards) for t in trajectories],
        }

    # --- metrics
    def _metrics(self, trajectories: list[Trajectory], errors: list[EnvError], incomplete: int, wall: float) -> dict[str, float]:
        p = self.name
        out: dict[str, float] = {f"{p}/env_errors": float(len(errors)), f"{p}/trajectories": float(len(trajectories)),
                                 f"{p}/groups_incomplete": float(incomplete), f"time/{p}": wall}
        by_tag: dict[str, list[Trajectory]] = {}
        for t in trajectories:
            by_tag.setdefault(t.request.slot.tag, []).append(t)
        for tag, ts in by_tag.items():
            out[f"{p}/{tag}/score"] = float(np.mean([t.score for t in ts]))
            keys = sorted({k for t in ts for k in t.metrics})
            for k in keys:
                out[f"{p}/{tag}/{k}"] = float(np.mean([t.metrics.get(k, 0.0) for t in ts]))
        if trajectories:
            out[f"{p}/score"] = float(np.mean([t.score for t in trajectories]))
            wins = float(sum(t.metrics.get("success", 0.0) for t in trajectories))
            out[f"{p}/success"] = wins / len(trajectories)
            # 95% Wilson interval: whether two evals differ, or a run beats a baseline, is read off these
            out[f"{p}/success_ci_low"], out[f"{p}/success_ci_high"] = wilson_interval(wins, len(trajectories))
            lat = [x for t in trajectories for x in t.turn_latencies]
            if lat:
                out[f"{p}/turn_latency_p50_s"] = float(np.percentile(lat, 50))
                out[f"{p}/turn_latency_p99_s"] = float(np.percentile(lat, 99))
            out[f"{p}/env_time_share"] = float(sum(t.metrics.get("env_time_s", 0.0) for t in trajectories)) / max(wall, 1e-9)
        if self.take_generation_stats is not None:
            g = self.take_generation_stats()
            if g.get("generate_calls"):
                out[f"{p}/mean_generate_batch"] = g["requests"] / g["generate_calls"]
                out[f"{p}/generated_tokens"] = float(g["tokens"])
                out[f"{p}/generate_tokens_per_s"] = g["tokens"] / max(wall, 1e-9)
        return out

    def _render(self, trajectories: list[Trajectory], step: int) -> None:
        assert self.render_dir is not None
        folder = self.render_dir / self.name / f"step_{step:05d}"
        for t in trajectories[: self.render_count]:
            name = f"{t.request.slot.tag}_env{t.request.slot.env_id}_ep{t.request.episode}"
            write_trajectory(folder, name, t.messages, t.turn_rewards, t.metrics, t.frames)


def _pad_rows(rows: list[Any], pad_id: int) -> Batch:
    width = max((len(r) for r in rows), default=0)
    n = len(rows)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    response = torch.zeros((n, width), dtype=torch.long)
    logprobs = torch.zeros((n, width), dtype=torch.float32)
    versions = torch.full((n, width), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        L = len(r)
        ids[i, :L] = torch.tensor(r.input_ids, dtype=torch.long)
        attention[i, :L] = 1
        response[i, :L] = torch.tensor(r.response_mask, dtype=torch.long)
        logprobs[i, :L] = torch.tensor(r.logprobs, dtype=torch.float32)
        versions[i, :L] = torch.tensor(r.versions, dtype=torch.long)
    position = (attention.cumsum(-1) - 1).clamp(min=0)
    # policy_version: per token, the weight version that sampled it (-1 off the model's tokens)
    return Batch({"input_ids": ids, "attention_mask": attention, "position_ids": position,
                  "response_mask": response, "infer_logprobs": logprobs, "policy_version": versions})


def local_factory(template: ChatTemplate, generate: Callable, params: SamplingParams, sequence_length: int,
                  keep_frames: bool, deterministic: bool = False, limits: EpisodeLimits | None = None) -> ManagerFactory:
    """Env managers in this process (threads): tests, debugging, the scripted policy."""

    def make(cls_path: str, slots: list[EnvSlot]) -> Any:
        return import_path(cls_path, "env_manager")(slots, template, generate, params, sequence_length, keep_frames=keep_frames,
                                     deterministic=deterministic, limits=limits)

    return make


class EnvManagerHost:
    """The Ray actor that hosts one env manager (``worker_cls`` may name a replacement)."""

    def __init__(self, cls_path: str, slots: list[EnvSlot], tokenizer_path: str, params: SamplingParams,
                 sequence_length: int, keep_frames: bool, server: Any, system_envs: dict[str, str] | None = None,
                 deterministic: bool = False, limits: EpisodeLimits | None = None) -> None:
        import os

        import ray
        from transformers import AutoTokenizer

        os.environ.update(system_envs or {})
        template = ChatTemplate(AutoTokenizer.from_pretrained(tokenizer_path), tokenizer_path)

        limits = limits or EpisodeLimits()
        wait = limits.episode_timeout or None

        def generate(route: str, prompt: list[int], p: SamplingParams) -> Any:
            return ray.get(server.generate.remote(route, prompt, p), timeout=wait)  # a lost request ends its episode

        self.manager = import_path(cls_path, "env_manager")(slots, template, generate, params, sequence_length, keep_frames=keep_frames,
                                             deterministic=deterministic, limits=limits)

    def granularity(self) -> str:
        return self.manager.granularity

    def run(self, requests: list[EpisodeRequest]) -> tuple[list[Trajectory], list[EnvError]]:
        return self.manager.run(requests)

    def activity(self) -> tuple[int, list[ActiveEpisode]]:
        """Answered while run() is in flight (the actor runs two calls at once)."""
        return self.manager.activity_snapshot()


class RemoteManager:
    """Driver-side handle of an EnvManagerHost actor."""

    def __init__(self, handle: Any, slots: list[EnvSlot], rpc_timeout: float | None = None) -> None:
        import ray

        self.handle, self.slots, self.rpc_timeout = handle, slots, rpc_timeout
        self.granularity = ray.get(handle.granularity.remote(), timeout=rpc_timeout)

    def run(self, requests: list[EpisodeRequest]) -> tuple[list[Trajectory], list[EnvError]]:
        import ray

        try:
            return ray.get(self.handle.run.remote(requests), timeout=self.rpc_timeout)
        except ray.exceptions.RayTaskError as e:  # the manager's own one line, not the remote traceback
            if isinstance(e.cause, EpisodeCrash):
                raise EpisodeCrash(str(e.cause)) from None
            raise
        except ray.exceptions.GetTimeoutError:
            tags = sorted({s.tag for s in self.slots})
            raise TimeoutError(f"env manager of {', '.join(tags)} (envs {self.slots[0].env_id}-{self.slots[-1].env_id}) "
                               f"did not finish its episodes within rpc_timeout={self.rpc_timeout} s") from None

    def activity_snapshot(self) -> tuple[int, list[ActiveEpisode]]:
        import ray

        return ray.get(self.handle.activity.remote(), timeout=self.rpc_timeout or 60)


def ray_factory(host_cls: type, tokenizer_path: str, params: SamplingParams, sequence_length: int, keep_frames: bool,
                server: Any, system_envs: dict[str, str] | None = None, deterministic: bool = False,
                limits: EpisodeLimits | None = None, rpc_timeout: float | None = None) -> ManagerFactory:
    """Env managers as Ray actors, each with its own env threads, sharing one generation server. They go
    round-robin over the env nodes (``roll.distributed.resources.env_nodes``), chosen among the nodes alive when
    each is made: a manager re-created after its node died lands on a surviving one."""
    import itertools

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from roll.distributed.resources import alive_nodes, env_nodes

    remote_host = ray.remote(host_cls)
    turn = itertools.count()

    def make(cls_path: str, slots: list[EnvSlot]) -> Any:
        nodes = env_nodes(alive_nodes())
        node = nodes[next(turn) % len(nodes)]
        # soft: a node that died but is not yet marked dead does not block the manager
        where = NodeAffinitySchedulingStrategy(node.node_id, soft=True)
        handle = remote_host.options(num_cpus=0.0001, max_concurrency=2, scheduling_strategy=where).remote(
            cls_path, slots, tokenizer_path, params, sequence_length, keep_frames, server, system_envs, deterministic, limits)
        log.info("env manager of envs %d-%d on node %s", slots[0].env_id, slots[-1].env_id, node.describe())
        return RemoteManager(handle, slots, rpc_timeout)

    return make


def sampling_params(cfg: Any, em: Any) -> SamplingParams:
    gen_args = em.generating_args or cfg.actor_infer.generating_args
    step_cap = max(int(cfg.custom_envs[t].max_tokens_per_step) for t in em.tags)
    return SamplingParams.from_generating_args(gen_args, max_new_tokens=gen_args.max_new_tokens or step_cap)


def make_rollout(cfg: Any, mode: str, template: ChatTemplate, factory_for: Callable[[SamplingParams, bool], ManagerFactory],
                 take_stats: Callable | None = None, render: bool = True) -> RolloutScheduler:
    """The train or validation rollout of a finalized PipelineConfig; ``factory_for(params, keep_frames)``
    chooses where the env managers run (``local_factory`` or ``ray_factory``)."""
    em = cfg.train_env_manager if mode == "train" else cfg.val_env_manager
    # frames go to the render folder and to trackers that show images
    keep_frames = bool(render and (cfg.render_save_dir or cfg.track_with in ("tensorboard", "wandb")))
    return RolloutScheduler(
        name="rollout" if mode == "train" else "val",
        slots=build_slots(cfg.custom_envs, em, cfg.seed),
        em_config=em,
        template=template,
        factory=factory_for(sampling_params(cfg, em), keep_frames),
        seed=cfg.seed,
        render_dir=cfg.render_save_dir if render else None,
        take_generation_stats=take_stats,
        fixed_seeds=mode != "train",
        monitor=cfg.env_monitor,
        group_filter=import_path(em.group_filter_cls, "group_filter")(cfg, em, "train" if mode == "train" else "val")
        if em.group_filter_cls else None,
    )
