"""hf_infer's generation engine: KV reuse across a conversation's turns, and continuous batching.

* **Prefix cache.** After a request finishes, the KV of its prompt and sampled tokens is kept; the
  next request whose prompt starts with (part of) those tokens prefills only the rest. A
  conversation's next turn therefore encodes just the new message, and the opening every episode
  shares (system prompt, demonstrations) is encoded once. Entries are evicted least-recently-used
  beyond ``max_tokens`` and all dropped when the weights change.
* **Continuous batching.** Requests join the running decode loop at its next step (calls from other
  threads are merged into it) and leave it the step they finish, so a short answer is returned
  without waiting on the slowest row of its batch. Requests that join at the same step have their
  prompts encoded together (``roll.strategies.hf_prefill``).
* **Sampling** is per request with its own ``torch.Generator``: a seeded request samples the same
  tokens whichever batch it lands in. Log-probs are of the raw logits (temperature 1), as training
  recomputes them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from roll.strategies.base import Generation, SamplingParams
from roll.strategies.hf_prefill import KV, MAX_GROUP_TOKENS, plan_groups, prefill_rows, stack_left_padded

# Uncached tokens two joining prompts may share before the later one waits for the earlier one's KV to be cached.
SHARED_OPENING = 32


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two 1-D token tensors."""
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if len(differ) else n


@dataclass(eq=False)
class _Entry:
    tokens: torch.Tensor
    kv: KV
    used: int


class PrefixCache:
    """KV of finished token sequences, looked up by longest common prefix."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._entries: list[_Entry] = []
        self._clock = 0
        self.stats = {"lookups": 0, "reused_tokens": 0, "prompt_tokens": 0}

    def __len__(self) -> int:
        return len(self._entries)

    def _best(self, prompt: torch.Tensor) -> tuple[_Entry | None, int]:
        best, best_n = None, 0
        for entry in self._entries:
            n = min(common_prefix(entry.tokens, prompt), len(prompt) - 1)
            if n > best_n:
                best, best_n = entry, n
        return best, best_n

    def covered(self, prompt: torch.Tensor) -> int:
        """How many of ``prompt``'s tokens a lookup would reuse (no statistics, no recency)."""
        return self._best(prompt)[1]

    def lookup(self, prompt: torch.Tensor) -> tuple[KV | None, int]:
        """The cached KV of the longest prefix of ``prompt`` (at most all but its last token, whose
        logits the caller needs), and that prefix's length."""
        self.stats["lookups"] += 1
        self.stats["prompt_tokens"] += len(prompt)
        best, best_n = self._best(prompt)
        if best is None:
            return None, 0
        self._clock += 1
        best.used = self._clock
        self.stats["reused_tokens"] += best_n
        return [(k[:, :, :best_n], v[:, :, :best_n]) for k, v in best.kv], best_n

    def add(self, tokens: torch.Tensor, kv: KV) -> None:
        if self.max_tokens <= 0 or len(tokens) > self.max_tokens:
            return
        # An entry this one extends (the same conversation's earlier turn) is superseded.
        self._entries = [e for e in self._entries if not (len(e.tokens) <= len(tokens) and common_prefix(e.tokens, tokens) == len(e.tokens))]
        self._clock += 1
        self._entries.append(_Entry(tokens, kv, self._clock))
        while sum(len(e.tokens) for e in self._entries) > self.max_tokens:
            self._entries.remove(min(self._entries, key=lambda e: e.used))

    def clear(self) -> None:
        self._entries = []

    def take_stats(self) -> dict[str, int]:
        stats, self.stats = self.stats, {"lookups": 0, "reused_tokens": 0, "prompt_tokens": 0}
        return stats


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """The distribution a row is sampled from: temperature, then top-k, then nucleus (top-p), over [V]."""
    x = logits.float() / temperature
    if 0 < top_k < x.shape[-1]:
        kth = torch.topk(x, top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        p = torch.softmax(sorted_x, dim=-1)
        drop = (p.cumsum(-1) - p) > top_p  # tokens entirely past the nucleus; the top one always stays
        x = x.scatter(0, order, sorted_x.masked_fill(drop, float("-inf")))
    return torch.softmax(x, dim=-1)


def penalise_repeats(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style repetition penalty (as transformers applies it) on the tokens in ``seen``."""
    if penalty == 1.0:
        return logits
    picked = logits[seen]
    logits = logits.clone()
    logits[seen] = torch.where(picked < 0, picked * penalty, picked / penalty)
    return logits


@dataclass(eq=False)
class _Request:
    prompt: torch.Tensor
    params: SamplingParams
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str = ""
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    kv: KV | None = None  # after prefill, until the row joins the batch
    next_logits: torch.Tensor | None = None


def heap_trimmer() -> Callable[[], Any] | None:
    """glibc's ``malloc_trim(0)``, which hands the C heap's free pages back to the OS; None where glibc is not.
    Called when the engine goes idle: a decode batch's KV and logits are freed into malloc's arenas, which keep
    them, so without it a worker's resident memory grows to its largest batch and stays there while the colocated
    trainer runs."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    return None if trim is None else lambda: trim(0)


class GenerationEngine:
    """Runs generation requests on one causal LM; thread-safe (one thread drives the model at a time)."""

    def __init__(self, model: torch.nn.Module, eos_ids: set[int], tokenizer: Any = None,
                 cache_tokens: int = 65536, seed: int = 0, max_rows: int = 32, prefill_tokens: int = MAX_GROUP_TOKENS) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        if prefill_tokens < 1:
            raise ValueError(f"prefill_tokens must be >= 1, got {prefill_tokens}")
        self.model = model
        self.max_rows = max_rows  # requests decoding at once; the rest wait in _pending
        self.prefill_tokens = prefill_tokens  # new tokens (padding included) one prefill forward encodes; 1: a row each
        self._trim_heap = heap_trimmer()
        self.eos_ids = set(eos_ids)
        self.tokenizer = tokenizer  # for stop strings
        self.cache = PrefixCache(cache_tokens)
        self._rng = torch.Generator().manual_seed(seed)  # seeds of requests that bring none
        self._lock = threading.Lock()
        self._pending: list[_Request] = []
        self._driving = False

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def clear_cache(self) -> None:
        with self._lock:
            self.cache.clear()

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        requests = []
        with self._lock:
            for i, p in enumerate(prompts):
                if not p:
                    raise ValueError("generate: an empty prompt")
                generator = None
                if not params.greedy:
                    seed = params.seed + i if params.seed is not None else int(torch.randint(0, 2**62, (1,), generator=self._rng))
                    generator = torch.Generator().manual_seed(seed)
                requests.append(_Request(torch.tensor(list(p), dtype=torch.long), params, generator))
            self._pending += requests
            drive = not self._driving
            self._driving = True
        if drive:
            self._drive()
        for r in requests:
            r.done.wait()
            if r.error is not None:
                raise r.error
        return [Generation(r.tokens, r.logprobs, r.finish) for r in requests]

    # --- the loop (one driving thread)
    def _drive(self) -> None:
        active: list[_Request] = []  # the batch's rows in order; finished ones stay until the next compaction
        joining: list[_Request] = []
        batch: _Batch | None = None
        try:
            while True:
                live = [i for i, r in enumerate(active) if not r.finish]
                with self._lock:
                    room = max(self.max_rows - len(live), 0)
                    joining, self._pending = self._pending[:room], self._pending[room:]
                    if not joining and not live:
                        self._driving = False
                        break
                # Dropping finished rows copies every layer's KV, so it waits until they are a quarter of the
                # batch or new rows join (which copies the KV anyway); until then they decode along, unread.
                if batch is not None and len(live) < len(active) and (joining or not live or 4 * (len(active) - len(live)) >= len(active)):
                    active = [active[i] for i in live]
                    batch = batch.select(live) if live else None
                with torch.no_grad():
                    self._prefill(joining)
                    for r in joining:
                        self._sample(r, r.next_logits)
                    fresh = [r for r in joining if not r.finish]
                    self._retire([r for r in joining if r.finish], None)
                    if fresh:
                        batch = _Batch.join(batch, fresh)
                        active += fresh
                    if not any(not r.finish for r in active):
                        continue
                    assert batch is not None
                    logits = batch.step(self.model, [r.tokens[-1] for r in active])
                    finished = []
                    for i, (r, row_logits) in enumerate(zip(active, logits)):
                        if not r.finish:
                            self._sample(r, row_logits)
                            if r.finish:
                                finished.append(i)
                    if finished:
                        # a row's KV is taken the step it finishes: later steps append tokens it did not sample
                        self._retire([active[i] for i in finished], [batch.row_kv(i) for i in finished])
        except BaseException as e:  # noqa: BLE001 - every waiting request gets the error
            with self._lock:
                stranded, self._pending = self._pending + joining + active, []
                self._driving = False
            for r in stranded:
                if not r.done.is_set():
                    r.error = e
                    r.done.set()
            raise
        if self._trim_heap is not None:
            self._trim_heap()

    def _prefill(self, rows: list[_Request]) -> None:
        """Encode the joining rows' prompts after their cached prefixes, in waves of batched forwards. A row that
        shares an opening not yet cached with an earlier row of its wave waits for the next wave, where that
        opening comes from the cache instead of being encoded once per row (a validation's 64 first turns)."""
        todo = list(rows)
        while todo:
            wave: list[_Request] = []
            with self._lock:
                for r in todo:
                    own = self.cache.covered(r.prompt)
                    if not any(common_prefix(r.prompt, w.prompt) > own + SHARED_OPENING for w in wave):
                        wave.append(r)
                hits = [self.cache.lookup(r.prompt) for r in wave]
            todo = [r for r in todo if r not in wave]
            for group in plan_groups([len(r.prompt) - n for _, n in hits], max_tokens=self.prefill_tokens):
                kvs, logits = prefill_rows(self.model, [(hits[i][0], wave[i].prompt[hits[i][1]:]) for i in group])
                for i, kv, row_logits in zip(group, kvs, logits):
                    wave[i].kv, wave[i].next_logits = kv, row_logits
                    with self._lock:  # rows of later waves may share the prompt's opening
                        self.cache.add(wave[i].prompt, kv)

    def _sample(self, r: _Request, logits: torch.Tensor) -> None:
        p = r.params
        logits = logits.float().cpu()
        if p.greedy:
            token = int(torch.argmax(logits))
        else:
            seen = torch.cat([r.prompt, torch.tensor(r.tokens, dtype=torch.long)])
            probs = sampling_probs(penalise_repeats(logits, seen, p.repetition_penalty), p.temperature, p.top_p, p.top_k)
            token = int(torch.multinomial(probs, 1, generator=r.generator))
        r.tokens.append(token)
        r.logprobs.append(float(torch.log_softmax(logits, dim=-1)[token]))
        if token in self.eos_ids:
            r.finish = "stop"
        elif p.stop_strings and self.tokenizer is not None and any(s in self.tokenizer.decode(r.tokens) for s in p.stop_strings):
            r.finish = "stop"
        elif len(r.tokens) >= p.max_new_tokens:
            r.finish = "length"

    def _retire(self, requests: list[_Request], kvs: list[KV] | None) -> None:
        for i, r in enumerate(requests):
            kv = kvs[i] if kvs is not None else r.kv
            if kv is not None:
                # The KV covers the prompt and every sampled token but the last (never fed back).
                covered = torch.cat([r.prompt, torch.tensor(r.tokens[:-1], dtype=torch.long)])
                with self._lock:
                    self.cache.add(covered, kv)
            r.kv = r.next_logits = None
            r.done.set()


class _Batch:
    """Rows decoding together: their KV left-padded to one length, a mask hiding the padding."""

    def __init__(self, kv: KV, mask: torch.Tensor, lengths: torch.Tensor) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(ddp_cache_data=kv)  # kept across steps: rebuilding it copies every layer
        self.mask = mask  # [B, width] 1 on real positions
        self.lengths = lengths  # [B] tokens each row has in the KV (its next position)

    @staticmethod
    def join(batch: _Batch | None, rows: list[_Request]) -> _Batch:
        parts: list[tuple[KV, torch.Tensor, int]] = []
        if batch is not None:
            parts.append((batch.kv, batch.mask, -1))
        for r in rows:
            assert r.kv is not None
            n = r.kv[0][0].shape[2]
            parts.append((r.kv, torch.ones(1, n, dtype=torch.long, device=r.kv[0][0].device), n))
        width = max(m.shape[1] for _, m, _ in parts)
        layers = stack_left_padded([kv for kv, _, _ in parts], width)
        mask = torch.cat([torch.nn.functional.pad(m, (width - m.shape[1], 0)) for _, m, _ in parts])
        lengths = [batch.lengths] if batch is not None else []
        lengths.append(torch.tensor([n for _, _, n in parts if n >= 0], dtype=torch.long, device=mask.device))
        return _Batch(layers, mask, torch.cat(lengths))

    def step(self, model: torch.nn.Module, last_tokens: list[int]) -> torch.Tensor:
        device = self.mask.device
        self.mask = torch.cat([self.mask, torch.ones(len(last_tokens), 1, dtype=torch.long, device=device)], dim=1)
        out = model(
            input_ids=torch.tensor(last_tokens, dtype=torch.long, device=device)[:, None],
            attention_mask=self.mask,
            position_ids=self.lengths[:, None],
            past_key_values=self.cache,
            use_cache=True,
        )
        self.lengths = self.lengths + 1
        return out.logits[:, -1]

    @property
    def kv(self) -> KV:
        return [(layer.keys, layer.values) for layer in self.cache.layers]

    def row_kv(self, i: int) -> KV:
        """Row ``i``'s KV without padding, in its own memory (the batch's tensors are dropped soon)."""
        pad = self.mask.shape[1] - int(self.lengths[i])
        return [(k[i:i + 1, :, pad:].clone(), v[i:i + 1, :, pad:].clone()) for k, v in self.kv]

    def select(self, keep: list[int]) -> _Batch:
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        width = int(self.lengths[index].max())
        cut = self.mask.shape[1] - width  # padding every remaining row has can go
        kv = [(k.index_select(0, index)[:, :, cut:], v.index_select(0, index)[:, :, cut:]) for k, v in self.kv]
        return _Batch(kv, self.mask.index_select(0, index)[:, cut:], self.lengths.index_select(0, index))
