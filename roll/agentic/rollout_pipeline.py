"""AgenticRolloutPipeline: play the envs with the policy and keep what happened; train nothing.

    for step in range(max_steps):
        rollout = train_rollout.collect(rollout_batch_size)    env managers x actor_infer, multi-turn
        log its metrics and one episode; write its rows         rollout_dump_dir (JSON Lines), rollout_mock dump

ROLL runs this with ``examples/start_agentic_rollout_pipeline.py``: to look at a model's behaviour,
to measure an env, or to collect data. Only actor_infer and the training env manager start.
"""

from __future__ import annotations

import logging
import time

from roll.agentic.pipeline import AgenticPipeline, _progress, _Timer, preflight
from roll.configs.derive import train_batch_size
from roll.configs.schema import PipelineConfig
from roll.utils.tracking import make_tracker

log = logging.getLogger(__name__)


class AgenticRolloutPipeline(AgenticPipeline):
    def __init__(self, cfg: PipelineConfig) -> None:  # noqa: D107 - no training state to set up or resume
        self.roles = ["actor_infer"]
        preflight(cfg, self.roles, rollout_only=True)
        self.cfg = cfg
        self._init_run_state()
        self.clusters = {}
        self._start_workers()
        self._start_rollouts()
        self.tracker = make_tracker(cfg.track_with, cfg.tracker_kwargs, cfg.logging_dir, cfg.exp_name)
        self.start_step = 0

    def run(self) -> dict[str, float]:
        cfg = self.cfg
        last: dict[str, float] = {}
        bar = _progress(cfg.max_steps, 0)
        samples = 0
        for step in range(cfg.max_steps):
            metrics: dict[str, float] = {}
            timer = _Timer(metrics, bar, self.origin)
            start = time.perf_counter()
            with timer("rollout"):
                rollout = self.collect("train", train_batch_size(cfg), step)
            metrics.update(rollout.metrics)
            samples += len(rollout.batch)
            metrics["system/samples"] = float(samples)
            metrics["time/step"] = time.perf_counter() - start
            last = self._end_step(step, metrics, rollout.trajectories, bar)
        bar.close()
        self.tracker.close()
        return last


__all__ = ["AgenticRolloutPipeline"]
