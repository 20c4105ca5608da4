"""Env managers as Ray actors, batched through one generation server into actor_infer workers."""

import pytest
from transformers import AutoTokenizer

from roll.agentic.conversation import ChatTemplate
from roll.agentic.generation import GenerationServer
from roll.agentic.rollout import EnvManagerHost, make_rollout, ray_factory
from roll.distributed.cluster import Cluster
from roll.distributed.resources import ResourceManager, ray_init
from roll.workers import ActorInferWorker

from ..strategies.helpers import worker_config
from .test_rollout import config

pytestmark = pytest.mark.slow


def test_ray_env_managers_batch_generation_into_the_inference_worker(tiny_model_path):
    import ray

    ray_init(num_cpus=2, object_store_mb=256)
    try:
        rm = ResourceManager([0], num_gpus_per_node=1, use_gpu=False)
        infer_cfg = worker_config(tiny_model_path, "hf_infer")
        infer_cfg.device_mapping = [0]
        infer = Cluster("actor_infer", ActorInferWorker, infer_cfg, rm, {"seed": 0})
        infer.call("initialize")
        server = ray.remote(GenerationServer).options(max_concurrency=256, num_cpus=0.0001).remote(infer.workers, 32, 0.05)
        cfg = config("max_tokens_per_step=8", "max_actions_per_traj=2", "train_env_manager.max_env_num_per_worker=4")
        template = ChatTemplate(AutoTokenizer.from_pretrained(tiny_model_path))

        def factory(params, frames):
            return ray_factory(EnvManagerHost, tiny_model_path, params, cfg.sequence_length, frames, server)

        rollout = make_rollout(cfg, "train", template, factory, lambda: ray.get(server.take_stats.remote()))
        assert len(rollout.managers) == 2  # 8 envs, 4 per env-manager actor
        result = rollout.collect(8, step=0)
        assert len(result.batch) == 8 and result.metrics["rollout/env_errors"] == 0
        assert result.metrics["rollout/mean_generate_batch"] > 1.0  # requests from both actors were batched
        assert result.batch["response_mask"].sum() > 0
        finished, running = rollout.managers[0].activity_snapshot()  # the env monitor's view of an actor
        assert finished == 4 and running == []
        # an env-manager actor that dies: its episodes are counted as lost, the others train, and the next
        # collection has it back
        ray.kill(rollout.managers[0].handle)
        result = rollout.collect(8, step=1)
        assert result.metrics["rollout/env_errors"] == 4 and len(result.batch) == 4
        result = rollout.collect(8, step=2)
        assert result.metrics["rollout/env_errors"] == 0 and len(result.batch) == 8
    finally:
        ray.shutdown()
