"""Reward normalisation, before advantages: one pass, with a scope for the mean and one for the std.

A scope is where a statistic is taken: ``batch`` (all rows), ``group`` (rows sharing a group id:
a GRPO group, an env tag, a state), ``running`` (running statistics over every batch so far), or
``None`` (the mean is not subtracted / the std does not divide). ``normalize_scores`` computes
``(x - mean) / (std + 1e-6)`` with each statistic from its own scope. A group of one, or a scope
whose std is (numerically) zero, carries no signal and gives exactly 0, never NaN.

The agentic ``reward_normalization.method`` names map onto scopes with ``method_scopes``:
identity -> (None, None), mean -> (scope, None), mean_std and asym_clip -> (scope, scope), where the
scope is ``batch`` for ``grouping: batch`` and ``group`` otherwise; asym_clip then clips the result
to ASYM_CLIP_RANGE.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roll.algorithms.masked import group_stats

NORM_METHODS = ("identity", "mean", "mean_std", "asym_clip")
NORM_SCOPES = ("batch", "group", "running")
ASYM_CLIP_RANGE = (-1.0, 3.0)  # asym_clip bounds penalties more tightly than rewards
STD_EPS = 1e-6  # added to the std; a std at or below it counts as zero


@dataclass
class RunningMeanStd:
    """Running mean/variance (parallel Welford update). State the caller keeps across steps."""

    mean: float = 0.0
    var: float = 1.0
    count: float = 0.0

    def update(self, x: torch.Tensor) -> RunningMeanStd:
        """Return the statistics after also seeing ``x`` (pure: self is unchanged)."""
        n = float(x.numel())
        if n == 0:
            return RunningMeanStd(self.mean, self.var, self.count)
        b_mean = float(x.double().mean())
        b_var = float(x.double().var(unbiased=False))
        total = self.count + n
        delta = b_mean - self.mean
        mean = self.mean + delta * n / total
        m2 = self.var * self.count + b_var * n + delta**2 * self.count * n / total
        return RunningMeanStd(mean, m2 / total, total)


@dataclass(frozen=True)
class NormSpec:
    """Which statistics normalise the scores, and an optional clip of the result."""

    mean_scope: str | None = None
    std_scope: str | None = None
    clip: tuple[float, float] | None = None

    @property
    def active(self) -> bool:
        return self.mean_scope is not None or self.std_scope is not None or self.clip is not None

    @property
    def uses_groups(self) -> bool:
        return "group" in (self.mean_scope, self.std_scope)


def method_scopes(method: str, grouping: str) -> NormSpec:
    """The scopes a ``reward_normalization.method`` stands for under ``grouping``."""
    if method not in NORM_METHODS:
        raise ValueError(f"unknown normalisation method {method!r}; use one of {NORM_METHODS}")
    scope = "batch" if grouping == "batch" else "group"
    if method == "identity":
        return NormSpec()
    if method == "mean":
        return NormSpec(scope, None)
    return NormSpec(scope, scope, ASYM_CLIP_RANGE if method == "asym_clip" else None)


def normalize_scores(
    scores: torch.Tensor,
    spec: NormSpec,
    groups: torch.Tensor | None = None,
    running: RunningMeanStd | None = None,
) -> tuple[torch.Tensor, RunningMeanStd | None]:
    """Normalise per-row ``scores`` as ``spec`` says; returns them with the updated running stats.

    Computed in float64, so equal values give exactly zero deviations; returned in the input dtype."""
    for scope in (spec.mean_scope, spec.std_scope):
        if scope is not None and scope not in NORM_SCOPES:
            raise ValueError(f"unknown normalisation scope {scope!r}; use one of {NORM_SCOPES} or None")
    if spec.uses_groups and groups is None:
        raise ValueError("a 'group' scope needs per-row group ids")
    dtype = scores.dtype
    x = scores.double()
    n = x.numel()
    new_running = running
    if "running" in (spec.mean_scope, spec.std_scope):
        new_running = (running or RunningMeanStd()).update(x)
    g_mean, g_std, g_count = group_stats(x, groups) if spec.uses_groups else (None, None, None)

    def stat(scope: str | None, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(statistic per row, whether it carries signal per row) for one scope."""
        signal = torch.ones_like(x, dtype=torch.bool)
        if scope == "batch":
            if kind == "mean":
                return x.mean().expand_as(x), signal
            std = x.std() if n > 1 else torch.zeros((), dtype=x.dtype)
            return std.expand_as(x), (std > STD_EPS).expand_as(x) if n > 1 else ~signal
        if scope == "group":
            assert g_mean is not None and g_std is not None and g_count is not None
            if kind == "mean":
                return g_mean, g_count > 1
            return g_std, (g_std > STD_EPS) & (g_count > 1)
        assert scope == "running" and new_running is not None
        value = new_running.mean if kind == "mean" else new_running.var**0.5
        ok = new_running.count > 1 and (kind == "mean" or value > STD_EPS)
        return torch.full_like(x, value), signal if ok else ~signal

    out = x
    carries = torch.ones_like(x, dtype=torch.bool)
    if spec.mean_scope is not None:
        mean, ok = stat(spec.mean_scope, "mean")
        out = out - mean
        carries &= ok
    if spec.std_scope is not None:
        std, ok = stat(spec.std_scope, "std")
        out = out / (std + STD_EPS)
        carries &= ok
    out = torch.where(carries, out, torch.zeros_like(out))
    if spec.clip is not None:
        out = out.clamp(*spec.clip)
    return out.to(dtype), new_running


def singleton_share(groups: torch.Tensor) -> float:
    """Share of groups that hold a single row (their normalised score is 0: no learning signal)."""
    if groups.numel() == 0:
        return 0.0
    counts = torch.bincount(groups)
    counts = counts[counts > 0]
    return float((counts == 1).sum()) / float(len(counts))
