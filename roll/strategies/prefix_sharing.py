"""Prefill a batch's shared openings once.

An engine's prefix cache reuses the KV of tokens it has already computed, but requests that arrive together each
compute their own copy: nothing is cached until one of them has run. In an agentic rollout the first turn of every
episode arrives together, and they share long openings (the system prompt and demonstrations across all episodes,
the first observation across a group's episodes), so the first turn prefills the same tokens once per episode.
Sending each shared opening ahead (a one-token request) and the batch after it makes every episode reuse it.
"""

from __future__ import annotations

from collections.abc import Sequence


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def shared_openings(prompts: Sequence[Sequence[int]], min_tokens: int) -> list[list[tuple[int, ...]]]:
    """The prefixes of at least ``min_tokens`` that two or more prompts share, maximal at each branching point, in
    levels: a prefix comes one level after the longest listed prefix it extends, so sending level by level (each
    level after the previous finished) computes every shared token once."""
    ordered = sorted(tuple(p) for p in prompts)
    found = set()
    for a, b in zip(ordered, ordered[1:]):
        n = common_length(a, b)
        if n >= min_tokens:
            found.add(a[:n])
    by_length = sorted(found, key=len)
    level_of: dict[tuple[int, ...], int] = {}
    for prefix in by_length:
        below = [level_of[p] for p in level_of if len(p) < len(prefix) and prefix[:len(p)] == p]
        level_of[prefix] = 1 + max(below, default=-1)
    levels: list[list[tuple[int, ...]]] = [[] for _ in range(1 + max(level_of.values(), default=-1))]
    for prefix, level in sorted(level_of.items()):
        levels[level].append(prefix)
    return levels
