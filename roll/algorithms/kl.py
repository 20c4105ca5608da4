"""KL estimators between the policy and the reference, and the KL coefficient controllers."""

from __future__ import annotations

from dataclasses import dataclass

import torch

KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")


def kl_penalty(
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    kind: str,
    logits: torch.Tensor | None = None,
    ref_logits: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate.

    kl/k1: logp - ref;  abs: |logp - ref|;  mse/k2: (logp - ref)^2 / 2;
    low_var_kl/k3: exp(ref - logp) - (ref - logp) - 1 (clamped to [-10, 10]);
    full: the exact KL over the whole vocabulary from ``logits`` and ``ref_logits`` ([..., V]).
    """
    if kind in ("kl", "k1"):
        return logprob - ref_logprob
    if kind == "abs":
        return (logprob - ref_logprob).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob) ** 2
    if kind in ("low_var_kl", "k3"):
        log_ratio = (ref_logprob - logprob).clamp(-20, 20)
        return (torch.exp(log_ratio) - log_ratio - 1).clamp(-10, 10)
    if kind == "full":
        if logits is None or ref_logits is None:
            raise ValueError("kl_penalty 'full' needs the policy and reference logits")
        logp = torch.log_softmax(logits.float(), dim=-1)
        ref = torch.log_softmax(ref_logits.float(), dim=-1)
        return (logp.exp() * (logp - ref)).sum(-1)
    raise ValueError(f"unknown KL estimator {kind!r}; use one of {KL_ESTIMATORS}")


@dataclass
class FixedKLController:
    value: float

    def update(self, current_kl: float, n_steps: int) -> FixedKLController:
        return self


@dataclass
class AdaptiveKLController:
    """Adaptive coefficient (Ziegler et al. 2019): moves the KL towards ``target``."""

    value: float
    target: float
    horizon: int

    def update(self, current_kl: float, n_steps: int) -> AdaptiveKLController:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        return AdaptiveKLController(self.value * (1.0 + error * n_steps / self.horizon), self.target, self.horizon)


def kl_controller(init_kl_coef: float, target_kl: float | None, kl_horizon: int) -> FixedKLController | AdaptiveKLController:
    if target_kl is None:
        return FixedKLController(init_kl_coef)
    if target_kl <= 0 or kl_horizon <= 0:
        raise ValueError(f"adaptive KL needs target_kl > 0 and kl_horizon > 0, got {target_kl}, {kl_horizon}")
    return AdaptiveKLController(init_kl_coef, target_kl, kl_horizon)
