"""The RL math as pure functions over tensors, masks and group ids (torch only: no Ray, no model,
no config objects; config values are passed in as arguments)."""

from roll.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    AdvantageParams,
    compute_advantages,
    postprocess_advantages,
    token_level_rewards,
)
from roll.algorithms.kl import KL_ESTIMATORS, kl_controller, kl_penalty
from roll.algorithms.losses import (
    LOSS_AGG_MODES,
    ActorLossConfig,
    GlobalCounts,
    actor_loss,
    aggregate,
    value_loss,
)
from roll.algorithms.reward_norm import (
    NORM_METHODS,
    NormSpec,
    RunningMeanStd,
    method_scopes,
    normalize_scores,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS", "AdvantageInputs", "AdvantageParams", "compute_advantages", "postprocess_advantages",
    "token_level_rewards", "KL_ESTIMATORS", "kl_controller", "kl_penalty", "LOSS_AGG_MODES", "ActorLossConfig",
    "GlobalCounts", "actor_loss", "aggregate", "value_loss", "NORM_METHODS", "NormSpec", "RunningMeanStd",
    "method_scopes", "normalize_scores",
]
