"""The episode loop shared by every env manager.

An env manager owns a set of env slots (one env each, created from its ``custom_envs`` entry) and
runs episodes on them concurrently, one thread per env. Generation goes through a ``generate``
callable (the dynamic batcher), so env work never holds up other envs' generation. An env that
raises drops only its episode: it is counted, the env is re-created, and the episode is retried
with the same seed up to ``max_env_retries`` times.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from roll.agentic.conversation import ChatTemplate, TokenRow
from roll.agentic.env_monitor import ActiveEpisode, EnvActivity
from roll.strategies.base import Generation, SamplingParams

log = logging.getLogger(__name__)

GenerateFn = Callable[[str, list[int], SamplingParams], Generation]
DEFAULT_SYSTEM = "You're a helpful assistant."
DEFAULT_TEMPLATE = "{observation}"
DEMONSTRATION_SEED = 1 << 30  # boards of the opening examples; far from the episode seeds a run draws


def demonstration_seed(episode_seed: int) -> int:
    """First board seed of an episode's own examples (demonstrations_per_episode): a hash of its seed, so that
    neighbouring episode seeds get unrelated boards (and the same seed, in any process, the same ones)."""
    return DEMONSTRATION_SEED + zlib.crc32(f"demonstrations-{episode_seed}".encode()) % (DEMONSTRATION_SEED - 4096)


@dataclass(frozen=True)
class EpisodeLimits:
    """How long env calls and episodes may take (seconds, 0 = no limit) and how often a failed episode
    is retried (an env manager config's env_step_timeout, episode_timeout, max_env_retries)."""

    env_step_timeout: float = 120.0
    episode_timeout: float = 3600.0
    max_env_retries: int = 3

    @staticmethod
    def of(em_config: Any) -> EpisodeLimits:
        return EpisodeLimits(em_config.env_step_timeout, em_config.episode_timeout, em_config.max_env_retries)


class EnvFault(Exception):
    """The env's own code failed (its constructor, reset, step, demonstrations) or ran past a limit: the episode is
    dropped, counted in env_errors and retried on a fresh env. Anything else an episode raises is not the env's."""


class EnvTimeout(EnvFault, TimeoutError):
    """An env call or an episode that ran past its limit."""


class EpisodeCrash(RuntimeError):
    """An episode failed outside the env (generation, the chat template, a manager's own code): the run stops with
    this one line naming where, instead of the failure hiding among env errors."""


def _env_fault(e: BaseException) -> EnvFault:
    return e if isinstance(e, EnvFault) else EnvFault(f"{type(e).__name__}: {e}")


@dataclass(frozen=True)
class EnvSlot:
    """One env of a manager: its id, its group (all envs of a group share config and seed) and tag."""

    env_id: int
    group_id: int
    tag: str
    entry: dict[str, Any]  # the custom_envs entry (env_type, env_config, templates, caps)


@dataclass(frozen=True)
class EpisodeRequest:
    slot: EnvSlot
    seed: int
    episode: int  # index of this episode for the env in this collection


@dataclass
class StepRecord:
    """One turn as a training row (step-wise managers)."""

    row: TokenRow
    reward: float
    state_hash: str
    step_idx: int
    observation: str = ""  # the observation the action was taken in
    action: str = ""  # the model's reply
    valid: bool = True  # the env's action_is_valid for it (when it reports one)


@dataclass
class Trajectory:
    request: EpisodeRequest
    row: TokenRow
    turn_rewards: list[float]
    metrics: dict[str, float]
    messages: list[dict[str, Any]]
    steps: list[StepRecord] = field(default_factory=list)
    frames: list[np.ndarray] = field(default_factory=list)
    turn_latencies: list[float] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None  # the tool schemas the episode declared

    @property
    def score(self) -> float:
        return float(sum(self.turn_rewards))


@dataclass
class EnvError:
    request: EpisodeRequest
    message: str


def state_hash(observation: str) -> str:
    return hashlib.sha1(observation.encode()).hexdigest()[:16]


class TrajEnvManager:
    """Trajectory-wise: one training row per episode (StarPO style)."""

    granularity = "trajectory"

    def __init__(
        self,
        slots: list[EnvSlot],
        template: ChatTemplate,
        generate: GenerateFn,
        params: SamplingParams,
        sequence_length: int,
        keep_frames: bool = False,
        deterministic: bool = False,
        limits: EpisodeLimits | None = None,
    ) -> None:
        self.slots = slots
        self.template = template
        self.generate = generate
        self.params = params
        self.sequence_length = sequence_length
        self.limits = limits or EpisodeLimits()
        self.keep_frames = keep_frames
        self.deterministic = deterministic
        self._envs: dict[int, Any] = {}
        # max_env_step_concurrent: env calls of a tag in flight at once (this manager's share of the limit)
        self._step_limits = {slot.tag: threading.BoundedSemaphore(int(slot.entry["max_env_step_concurrent"]))
                             for slot in slots if int(slot.entry.get("max_env_step_concurrent") or 0) > 0}
        self._demonstrations: dict[str, list[tuple[str, str]]] = {}
        # the suffix the env gave with the observation being rendered (GEM's info["suffix"]); an episode runs
        # start to end in one thread
        self._observed = threading.local()
        self.activity = EnvActivity()  # what each env is doing, for the driver's env monitor

    # --- hooks a custom env manager may override
    def make_env(self, slot: EnvSlot) -> Any:
        from envs.registration import make_env

        entry = slot.entry
        kwargs = dict(entry.get("env_config") or {})
        if self.keep_frames and not _is_gem(entry["env_type"], entry.get("entry_point")):
            kwargs.setdefault("render_mode", "rgb_array")
        env = make_env(entry["env_type"], entry.get("entry_point"), **kwargs)
        if entry.get("tool_wrapper"):
            from envs.tools.tool_wrapper import wrap_tools

            env = wrap_tools(env, entry["tool_wrapper"])
        return env

    def format_observation(self, slot: EnvSlot, observation: str, turn_idx: int, actions_left: int) -> str:
        template = slot.entry.get("agent_template") or DEFAULT_TEMPLATE
        return template.format(observation=observation, turn_idx=turn_idx, actions_left=actions_left,
                               max_response_length=slot.entry.get("max_tokens_per_step", self.params.max_new_tokens),
                               suffix=self.suffix())

    def suffix(self) -> str:
        """What the env added to the observation being rendered, for a template's {suffix} (GEM's info["suffix"])."""
        return str(getattr(self._observed, "suffix", "") or "")

    def system_prompt(self, slot: EnvSlot) -> str:
        return slot.entry.get("agent_system_template") or DEFAULT_SYSTEM

    def opening(self, slot: EnvSlot, env: Any, observation: str, info: dict[str, Any], max_turns: int) -> list[dict[str, Any]]:
        """The messages before the model's first turn: system, the demonstration exchanges (if the entry asks
        for any), and the first observation. The env's instruction leads the first user message."""
        tools = info.get("tools")
        system = {"role": "system", "content": self.template.system_content(self.system_prompt(slot), tools)}
        users = [self.format_observation(slot, obs, 1, max_turns) for obs, _ in self.demonstration_pairs(slot, env)]
        replies = [reply for _, reply in self.demonstration_pairs(slot, env)]
        users.append(self.format_observation(slot, observation, 1, max_turns))
        instruction = info.get("env_instruction")
        if instruction:
            users[0] = f"{instruction}\n{users[0]}"
        messages = [system]
        for user, reply in zip(users, replies):
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        return messages + [{"role": "user", "content": users[-1]}]

    def demonstration_pairs(self, slot: EnvSlot, env: Any) -> list[tuple[str, str]]:
        """The entry's ``num_demonstrations`` (observation, reply) examples: one set per tag, or with
        ``demonstrations_per_episode`` one set per episode seed. They are made on ``env`` before its episode's
        reset (``run_episode`` asks first), so the episode is not affected."""
        count = int(slot.entry.get("num_demonstrations") or 0)
        if count <= 0:
            return []
        if slot.entry.get("demonstrations_per_episode"):
            seed = int(self._observed.episode_seed)
            cached = getattr(self._observed, "demonstrations", None)
            if cached is None or cached[0] != (slot.tag, seed):
                pairs = env.demonstrations(count, seed=demonstration_seed(seed))
                self._observed.demonstrations = cached = ((slot.tag, seed), pairs)
            return cached[1]
        if slot.tag not in self._demonstrations:
            self._demonstrations[slot.tag] = env.demonstrations(count, seed=DEMONSTRATION_SEED)
        return self._demonstrations[slot.tag]

    # --- running
    def run(self, requests: list[EpisodeRequest]) -> tuple[list[Trajectory], list[EnvError]]:
        """Run every request (episodes of one env run in order, envs in parallel)."""
        by_env: dict[int, list[EpisodeRequest]] = {}
        for r in requests:
            by_env.setdefault(r.slot.env_id, []).append(r)
        trajectories: list[Trajectory] = []
        errors: list[EnvError] = []
        with ThreadPoolExecutor(max_workers=max(1, len(by_env)), thread_name_prefix="env") as pool:
            for trajs, errs in pool.map(self._run_env, by_env.values()):
                trajectories += trajs
                errors += errs
        return trajectories, errors

    def _run_env(self, requests: list[EpisodeRequest]) -> tuple[list[Trajectory], list[EnvError]]:
        trajectories, errors = [], []
        for request in requests:
            for _attempt in range(self.limits.max_env_retries + 1):
                slot = request.slot
                self.activity.begin(slot.tag, slot.env_id, request.seed, request.episode)
                try:
                    trajectories.append(self.run_episode(request))
                    break
                except EnvFault as e:  # the env's own failure drops this episode only
                    errors.append(EnvError(request, str(e)))  # _env_fault already named the env's exception
                    log.warning("env %s (%s, seed %s) %s: %s; re-creating it", request.slot.env_id, request.slot.tag,
                                request.seed, "hung" if isinstance(e, EnvTimeout) else "raised", e)
                    self._envs.pop(request.slot.env_id, None)
                except Exception as e:
                    phase = self.activity.phase_of(slot.env_id)
                    raise EpisodeCrash(f"{type(self).__name__}, env {slot.env_id} ({slot.tag}, seed {request.seed}), "
                                       f"during {phase}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                                       ) from e
                finally:
                    self.activity.end(slot.env_id)
        return trajectories, errors

    def activity_snapshot(self) -> tuple[int, list[ActiveEpisode]]:
        return self.activity.snapshot()

    def _env(self, slot: EnvSlot) -> Any:
        if slot.env_id not in self._envs:
            try:
                self._envs[slot.env_id] = self.make_env(slot)
            except Exception as e:  # the env's constructor
                raise _env_fault(e) from e
        return self._envs[slot.env_id]

    def run_episode(self, request: EpisodeRequest) -> Trajectory:
        slot = request.slot
        entry = slot.entry
        env = self._env(slot)
        max_turns = int(entry.get("max_steps", 10))
        step_cap = int(entry.get("max_tokens_per_step", self.params.max_new_tokens))
        self._observed.episode_seed = request.seed
        try:
            self.demonstration_pairs(slot, env)  # before reset: making them resets the env
        except Exception as e:  # the env's own expert and boards
            raise _env_fault(e) from e
        started = t_env = time.perf_counter()
        obs, info = self.call_env(slot, "reset", 0, env.reset, seed=request.seed)
        self._observed.suffix = info.get("suffix")
        env_time = time.perf_counter() - t_env
        tools = info.get("tools")
        messages = self.opening(slot, env, obs, info, max_turns)
        row = TokenRow()
        row.add_context(self.template.prompt_ids(messages, tools))
        history = _History(env)
        frames = [env.render_rgb()] if self.keep_frames and hasattr(env, "render_rgb") else []
        rewards: list[float] = []
        latencies: list[float] = []
        steps: list[StepRecord] = []
        truncated_by = ""
        for turn in range(max_turns):
            budget = min(step_cap, self.sequence_length - len(row) - 1)
            if budget <= 0:
                truncated_by = "sequence_length"
                break
            prompt_row = self.turn_prompt(row, messages, tools, slot, turn)
            t0 = time.perf_counter()
            params = _with_budget(self.params, budget)
            if self.deterministic:  # its own seed: the sample does not depend on which batch it lands in
                params = dataclasses.replace(params, seed=(request.seed * 1_000_003 + slot.env_id * 101 + turn) % 2**31)
            self.activity.progress(slot.env_id, turn + 1, "generate")
            gen = self.generate(f"{slot.env_id}", prompt_row.input_ids, params)
            latencies.append(time.perf_counter() - t0)
            text, closed = self._add_turn(row, prompt_row, gen, steps, obs, turn)
            messages.append({"role": "assistant", "content": text})
            t_env = time.perf_counter()
            if self.limits.episode_timeout and t_env - started > self.limits.episode_timeout:
                raise EnvTimeout(f"the episode took longer than {self.limits.episode_timeout:g} s (at turn {turn + 1})")
            obs, reward, terminated, truncated, step_info = self.call_env(slot, "step", turn + 1, env.step, text)
            env_time += time.perf_counter() - t_env
            self._observed.suffix = step_info.get("suffix")
            history.add(step_info, len(gen.token_ids), gen.finish_reason)
            rewards.append(float(reward))
            if steps:
                steps[-1].reward = float(reward)
                steps[-1].valid = bool((step_info.get("metrics") or {}).get("action_is_valid", True))
            if frames:
                frames.append(env.render_rgb())
            if terminated or truncated:
                truncated_by = "env" if truncated else ""
                break
            role = step_info.get("observation_role", "user")
            content = obs if role == "tool" else self.format_observation(slot, obs, turn + 2, max_turns - turn - 1)
            message = {"role": role, "content": content}
            delta = self.template.delta_ids(message, tools)
            if len(row) + len(delta) >= self.sequence_length:
                truncated_by = "sequence_length"
                break
            row.add_context(delta)
            messages.append(message)
        else:
            truncated_by = "max_steps"
        metrics = history.metrics(truncated_by)
        metrics["env_time_s"] = env_time
        return Trajectory(request, row, rewards, metrics, messages, steps, frames, latencies, tools)

    def call_env(self, slot: EnvSlot, what: str, turn: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` bounded by env_step_timeout. A call that does not return in time is left
        behind in its (daemon) thread, its env is dropped by the caller, and EnvTimeout names it."""
        self.activity.progress(slot.env_id, turn, f"env.{what}")
        timeout = self.limits.env_step_timeout
        limiter = self._step_limits.get(slot.tag)
        if limiter is not None:
            if not limiter.acquire(timeout=timeout or None):
                raise EnvTimeout(f"no free env call slot of {slot.tag} within env_step_timeout={timeout:g} s "
                                 f"(max_env_step_concurrent; turn {turn})")
        if not timeout:
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # the env's code: an env fault
                raise _env_fault(e) from e
            finally:
                if limiter is not None:
                    limiter.release()
        box: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - re-raised in the episode's thread
                box["error"] = e
            finally:
                if limiter is not None:
                    limiter.release()  # when the call really ends: a hung call keeps its slot
                done.set()

        threading.Thread(target=target, daemon=True, name=f"env-{slot.env_id}-{what}").start()
        if not done.wait(timeout):
            raise EnvTimeout(f"env.{what} did not return within env_step_timeout={timeout:g} s (turn {turn})")
        if "error" in box:
            error = box["error"]
            raise (_env_fault(error) if isinstance(error, Exception) else error) from error
        return box["value"]

    # --- per-granularity pieces
    def turn_prompt(self, row: TokenRow, messages: list[dict[str, Any]], tools: list | None, slot: EnvSlot, turn: int) -> TokenRow:
        """The tokens the policy is conditioned on for this turn: the whole conversation so far."""
        return row

    def _add_turn(self, row: TokenRow, prompt: TokenRow, gen: Generation, steps: list[StepRecord], obs: str, turn: int) -> tuple[str, bool]:
        ids = list(gen.token_ids)
        closed = bool(ids) and ids[-1] == self.template.eos_id
        row.add_response(ids, gen.logprobs, gen.version)
        if not closed:
            row.add_context([self.template.eos_id])  # close the turn so the next message follows the template
        return self.template.decode(ids[:-1] if closed else ids), closed


class _History:
    """Per-episode metric aggregation following the env's declared metric_aggregation."""

    def __init__(self, env: Any) -> None:
        self.aggregation = dict(getattr(env, "metric_aggregation", {}))
        self.values: dict[str, list[float]] = {}
        self.response_lengths: list[int] = []
        self.hit_token_cap = 0

    def add(self, info: dict[str, Any], response_tokens: int, finish_reason: str) -> None:
        for k, how in dict(info.get("metrics_agg_mode") or {}).items():  # GEM's envs say it per step
            self.aggregation[str(k)] = str(how)
        for k, v in (info.get("metrics") or {}).items():
            if isinstance(v, (bool, int, float)):
                self.values.setdefault(k, []).append(float(v))
        self.response_lengths.append(response_tokens)
        self.hit_token_cap += finish_reason == "length"

    def metrics(self, truncated_by: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for k, vals in self.values.items():
            how = self.aggregation.get(k, "mean")
            out[k] = vals[-1] if how == "last" else sum(vals) if how == "sum" else sum(vals) / len(vals)
        valid = self.values.get("action_is_valid", [])
        out["num_actions"] = float(len(self.response_lengths))
        out["format_errors"] = float(sum(1 for v in valid if v == 0.0))
        out["response_length"] = float(np.mean(self.response_lengths)) if self.response_lengths else 0.0
        out["turns_hit_token_cap"] = float(self.hit_token_cap)
        for reason in ("max_steps", "sequence_length", "env"):
            out[f"truncated_{reason}"] = float(truncated_by == reason)
        return out


def _is_gem(env_type: str, entry_point: str | None) -> bool:
    from envs.gem_adapter import is_gem_id

    return entry_point is None and is_gem_id(env_type)


def _with_budget(params: SamplingParams, budget: int) -> SamplingParams:
    if params.max_new_tokens == budget:
        return params
    from dataclasses import replace

    return replace(params, max_new_tokens=budget)
