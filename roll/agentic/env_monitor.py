"""What every env is doing during a rollout, and a periodic report of it (ROLL's ``env_monitor`` keys).

Each env manager records, per env, the episode it runs (tag, seed), its turn and phase (``reset``,
``generate``, ``env.step``) and when it last made progress (``EnvActivity``). While a collection runs, the
driver polls every manager each ``monitor_interval`` seconds (``ActivityMonitor``): it logs one progress line
(episodes finished, running, the longest-idle env), and warns once per episode about an env that made no
progress for ``hung_timeout`` seconds, naming tag, env id, seed, turn and phase. Env-call and episode time
limits (``env_step_timeout``, ``episode_timeout``) are what drop a hung episode; the monitor makes a slow or
stuck rollout visible while it happens, including where those limits are off.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActiveEpisode:
    tag: str
    env_id: int
    seed: int
    episode: int
    turn: int
    phase: str
    running_s: float  # since the episode began
    idle_s: float  # since its last progress (a phase began)


class EnvActivity:
    """Per-env progress of one env manager; written by its env threads, read by ``snapshot`` (any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: dict[int, dict[str, Any]] = {}
        self.finished = 0

    def begin(self, tag: str, env_id: int, seed: int, episode: int) -> None:
        now = time.monotonic()
        with self._lock:
            self._active[env_id] = {"tag": tag, "seed": seed, "episode": episode, "turn": 0, "phase": "reset",
                                    "began": now, "last": now}

    def progress(self, env_id: int, turn: int, phase: str) -> None:
        with self._lock:
            entry = self._active.get(env_id)
            if entry is not None:
                entry.update(turn=turn, phase=phase, last=time.monotonic())

    def phase_of(self, env_id: int) -> str:
        """Where an env's episode is: 'turn 3, generate', or 'start' before its first phase."""
        with self._lock:
            entry = self._active.get(env_id)
        return f"turn {entry['turn']}, {entry['phase']}" if entry is not None else "start"

    def end(self, env_id: int) -> None:
        with self._lock:
            if self._active.pop(env_id, None) is not None:
                self.finished += 1

    def snapshot(self) -> tuple[int, list[ActiveEpisode]]:
        """(episodes ended so far, the ones running now)."""
        now = time.monotonic()
        with self._lock:
            return self.finished, [
                ActiveEpisode(e["tag"], env_id, e["seed"], e["episode"], e["turn"], e["phase"], now - e["began"],
                              now - e["last"]) for env_id, e in sorted(self._active.items())]


class ActivityMonitor:
    """Polls ``sources`` (each returns an EnvActivity snapshot) every ``interval`` seconds while a collection
    runs; ``with`` starts and stops it. ``reports`` counts the hung-env warnings given."""

    def __init__(self, name: str, sources: Sequence[Callable[[], tuple[int, list[ActiveEpisode]]]], interval: float,
                 hung_timeout: float) -> None:
        self.name, self.sources, self.interval, self.hung_timeout = name, list(sources), interval, hung_timeout
        self.reports = 0
        self._reported: set[tuple[int, int, int]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ActivityMonitor:
        if self.interval > 0:
            self._thread = threading.Thread(target=self._loop, daemon=True, name=f"{self.name}-env-monitor")
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.check()

    def check(self) -> None:
        """One look at every manager: a progress line, and a warning per newly hung episode."""
        finished, running = 0, []
        for source in self.sources:
            try:
                done, active = source()
            except Exception as e:  # noqa: BLE001 - a manager that cannot answer is reported, not fatal
                log.warning("%s: an env manager did not report its activity (%s: %s)", self.name, type(e).__name__, e)
                continue
            finished += done
            running += active
        if not running:
            return
        slowest = max(running, key=lambda a: a.idle_s)
        log.info("%s: %d episodes finished, %d running; longest without progress: env %d (%s, seed %d) in %s of "
                 "turn %d for %.0f s", self.name, finished, len(running), slowest.env_id, slowest.tag, slowest.seed,
                 slowest.phase, slowest.turn, slowest.idle_s)
        for a in running:
            key = (a.env_id, a.seed, a.episode)
            if a.idle_s >= self.hung_timeout and key not in self._reported:
                self._reported.add(key)
                self.reports += 1
                log.warning("%s: env %d (%s, seed %d) has made no progress for %.0f s (in %s of turn %d, episode "
                            "running %.0f s; env_monitor.hung_timeout=%g)", self.name, a.env_id, a.tag, a.seed,
                            a.idle_s, a.phase, a.turn, a.running_s, self.hung_timeout)
