"""Role workers: each wraps one strategy for one role and runs as a Ray actor."""

from roll.workers.actor_infer import ActorInferWorker
from roll.workers.actor_train import ActorTrainWorker
from roll.workers.critic import CriticWorker
from roll.workers.reference import ReferenceWorker

DEFAULT_WORKERS = {
    "actor_train": ActorTrainWorker,
    "actor_infer": ActorInferWorker,
    "critic": CriticWorker,
    "reference": ReferenceWorker,
    "reward": ReferenceWorker,
}

__all__ = ["ActorInferWorker", "ActorTrainWorker", "CriticWorker", "ReferenceWorker", "DEFAULT_WORKERS"]
