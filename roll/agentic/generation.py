"""Generation for rollouts: dynamic batching of env requests into the inference workers.

Env threads call ``generate(route, prompt_ids, params)`` and block. Requests wait in a queue per
inference rank (``route`` sticks an env to one rank); a batch closes when it is full or when the
oldest request has waited ``max_wait_s``. Up to ``max_inflight`` batches per rank run at once:
requests that arrive while a batch runs form the next one and go out at once, so an engine that
batches continuously (hf_infer, vLLM) takes them into its running decode loop instead of making
them wait for the slowest row of the batch before. The backend is anything with
``generate(rank, prompts, params) -> list[Generation]``: Ray inference workers, an in-process
strategy, or a scripted policy (no model) for env debugging.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from roll.strategies.base import Generation, SamplingParams

Backend = Callable[[int, list[list[int]], SamplingParams], list[Generation]]


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    arrived: float
    done: threading.Event = field(default_factory=threading.Event)
    result: Generation | None = None
    error: BaseException | None = None


class RequestBatcher:
    def __init__(self, backend: Backend, num_ranks: int, max_batch_size: int = 64, max_wait_s: float = 0.02,
                 max_inflight: int = 4) -> None:
        self.backend = backend
        self.num_ranks = num_ranks
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._slots = [threading.Semaphore(max(1, max_inflight)) for _ in range(num_ranks)]
        self._stats_lock = threading.Lock()
        self._queues: list[list[_Request]] = [[] for _ in range(num_ranks)]
        self._cond = threading.Condition()
        self._closed = False
        # weight syncs happen between batches: pause() stops new batches and waits for the running ones
        self.version = 0  # the policy version every result is stamped with
        self._paused = False
        self._inflight = 0
        self.stats = {"generate_calls": 0, "requests": 0, "tokens": 0, "generate_s": 0.0}
        self._threads = [threading.Thread(target=self._serve, args=(r,), daemon=True, name=f"batcher-{r}") for r in range(num_ranks)]
        for t in self._threads:
            t.start()

    def rank_of(self, route: str) -> int:
        return zlib.crc32(route.encode()) % self.num_ranks  # stable across processes, unlike hash()

    def generate(self, route: str, prompt: list[int], params: SamplingParams) -> Generation:
        req = _Request(list(prompt), params, time.monotonic())
        with self._cond:
            self._queues[self.rank_of(route)].append(req)
            self._cond.notify_all()
        req.done.wait()
        if req.error is not None:
            raise req.error
        assert req.result is not None
        return req.result

    def _serve(self, rank: int) -> None:
        queue = self._queues[rank]
        while True:
            with self._cond:
                while not self._closed and (not queue or self._paused):
                    self._cond.wait()
                if self._closed:
                    return
                deadline = queue[0].arrived + self.max_wait_s
                while not self._closed and len(queue) < self.max_batch_size and time.monotonic() < deadline:
                    self._cond.wait(timeout=max(0.0, deadline - time.monotonic()))
                if self._paused:  # a weight sync began while the batch was filling: wait for it
                    continue
                batch, queue[:] = queue[: self.max_batch_size], queue[self.max_batch_size:]
                self._inflight += 1
                version = self.version
            self._slots[rank].acquire()
            threading.Thread(target=self._run, args=(rank, batch, version), daemon=True, name=f"batch-{rank}").start()

    def _run(self, rank: int, batch: list[_Request], version: int) -> None:
        try:
            self._run_batch(rank, batch, version)
        finally:
            self._slots[rank].release()
            with self._cond:
                self._inflight -= 1
                self._cond.notify_all()

    def pause(self) -> None:
        """Stop starting batches and wait until the running ones have returned (before a weight sync)."""
        with self._cond:
            self._paused = True
            while self._inflight:
                self._cond.wait()

    def resume(self, version: int) -> None:
        """Start batches again; their results are stamped with ``version`` (the weights just synced)."""
        with self._cond:
            self.version = version
            self._paused = False
            self._cond.notify_all()

    def _run_batch(self, rank: int, batch: list[_Request], version: int) -> None:
        by_params: dict[SamplingParams, list[_Request]] = {}
        for req in batch:
            by_params.setdefault(req.params, []).append(req)
        for params, reqs in by_params.items():
            start = time.perf_counter()
            try:
                results = self.backend(rank, [r.prompt for r in reqs], params)
            except BaseException as e:  # noqa: BLE001 - handed to every waiting env thread
                for r in reqs:
                    r.error = e
                    r.done.set()
                continue
            with self._stats_lock:
                self.stats["generate_s"] += time.perf_counter() - start
                self.stats["generate_calls"] += 1
                self.stats["requests"] += len(reqs)
                self.stats["tokens"] += sum(len(g.token_ids) for g in results)
            for r, g in zip(reqs, results):
                r.result = dataclasses.replace(g, version=version)
                r.done.set()

    def take_stats(self) -> dict[str, float]:
        with self._stats_lock:
            stats, self.stats = self.stats, {"generate_calls": 0, "requests": 0, "tokens": 0, "generate_s": 0.0}
        return dict(stats)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class ScriptedPolicy:
    """A model-free policy for env debugging: answers with a random choice from ``responses``
    (strings), encoded with the tokenizer and closed with EOS. Log-probs are 0."""

    def __init__(self, tokenizer: Any, responses: Sequence[str], seed: int = 0) -> None:
        self.tokenizer = tokenizer
        self.responses = list(responses)
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def __call__(self, rank: int, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        out = []
        for _ in prompts:
            with self.lock:
                text = self.rng.choice(self.responses)
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])[: max(0, params.max_new_tokens - 1)]
            ids.append(self.tokenizer.eos_token_id)
            out.append(Generation(ids, [0.0] * len(ids), "stop"))
        return out


def worker_backend(workers: list[Any]) -> Backend:
    """A backend over Ray inference workers (actor_infer): rank i goes to worker i."""

    def call(rank: int, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        import ray

        return ray.get(workers[rank].generate.remote(prompts, params))

    return call


class GenerationServer:
    """A Ray actor hosting a RequestBatcher, shared by all env-manager actors of a rollout."""

    def __init__(self, workers: list[Any], max_batch_size: int, max_wait_s: float) -> None:
        self.batcher = RequestBatcher(worker_backend(workers), len(workers), max_batch_size, max_wait_s)

    def generate(self, route: str, prompt: list[int], params: SamplingParams) -> Generation:
        return self.batcher.generate(route, prompt, params)

    def take_stats(self) -> dict[str, float]:
        return self.batcher.take_stats()

    def pause(self) -> None:
        self.batcher.pause()

    def resume(self, version: int) -> None:
        self.batcher.resume(version)
