"""ROLL's own GEM task ids (``roll_math``, ``roll_qa``, ``roll_code``): single-turn problems from a data set.

Each builds on GEM's env of the same kind (GEM's answer extraction and grading) and reports what ROLL's
versions report: ``action_is_valid`` (an answer in the expected form was found), ``success`` and
``raw_reward``, with their aggregation modes. Differences from GEM's own classes, as ROLL has them:
- the problem of an episode is chosen by its seed (``reset(seed=s)`` serves the same problem for the same
  ``s`` in every process: the members of a GRPO group see one problem); without a seed the envs walk the
  shuffled set in order;
- the data come from ``envs.task_data`` (local files or the local hub cache), never downloaded.
Math answers are graded by math-verify in a worker process with a timeout, as GEM and ROLL do (math-verify's
own timeout uses signals, which work only in a main thread; env calls run in threads here). The worker is
forked on the first answer to grade and runs nothing but the grader.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import weakref
from typing import Any

from gem.core import Env
from gem.envs.code_env import CodeEnv
from gem.envs.math_env import MathEnv
from gem.envs.qa_env import QaEnv
from gem.utils.constants import TERMINAL_STATE
from gem.utils.parsing import extract_last_boxed_answer

GRADE_TIMEOUT_S = 1.0  # as GEM's and ROLL's math envs
AGG = {"action_is_valid": "mean", "success": "last", "raw_reward": "last"}


def _outcome(valid: bool, reward: float) -> tuple[str, float, bool, bool, dict[str, Any]]:
    metrics = {"action_is_valid": float(valid), "success": float(reward > 0), "raw_reward": float(reward)}
    return TERMINAL_STATE, float(reward), True, True, {"metrics": metrics, "metrics_agg_mode": dict(AGG)}


def _problems(dataset: Any, name: str, split: str | None, *fields: str) -> Any:
    """``dataset`` as given (the adapter reads it), else the records of ``name`` read offline."""
    if dataset is not None:
        return dataset
    from envs.task_data import load_problems

    return load_problems(name, split, required=fields)


class _BySeed:
    """Problem choice shared by the three envs: by seed, or in shuffled order without one."""

    dataset: Any
    seed: int
    idx: int
    epoch: int

    def _pick(self, seed: int | None) -> dict[str, Any]:
        # by a local RNG: GEM's base reset would seed the global one
        if seed is not None:
            index = random.Random(int(seed)).randrange(len(self.dataset))
        else:
            if self.idx >= len(self.dataset):
                self.epoch += 1
                self.dataset = self.dataset.shuffle(seed=self.seed + self.epoch)
                self.idx = 0
            index = self.idx
            self.idx += 1
        return self.dataset[index]


class RollMathEnv(_BySeed, MathEnv):
    def __init__(self, dataset_name: str = "", split: str | None = None, dataset: Any = None, question_key: str = "problem",
                 answer_key: str = "answer", seed: int = 0, mode: str = "train", **_: Any) -> None:
        dataset = _problems(dataset, dataset_name, split, question_key, answer_key)
        Env.__init__(self)
        self.seed, self.mode = int(seed), mode
        self.question_key, self.answer_key = question_key, answer_key
        self.dataset = dataset.shuffle(seed=self.seed)
        self.idx = self.epoch = 0
        self.mp_pool: Any = None  # made on the first answer to grade

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        data = self._pick(seed)
        self.first_obs, self.answer = str(data[self.question_key]), data[self.answer_key]
        return self.first_obs, {"env_instruction": ""}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        answer = extract_last_boxed_answer(action)
        if answer is None:
            return _outcome(False, 0.0)
        if self.mp_pool is None:
            self.mp_pool = multiprocessing.get_context("fork").Pool(1)
            weakref.finalize(self, self.mp_pool.terminate)  # also at interpreter exit, before multiprocessing unloads
        job = self.mp_pool.apply_async(self.check_correct, (answer, self.answer))
        try:
            correct = bool(job.get(timeout=GRADE_TIMEOUT_S))
        except Exception:  # noqa: BLE001 - a timeout or a grader error is a wrong answer, as in GEM
            correct = False
        return _outcome(True, 1.0 if correct else 0.0)

    def close(self) -> None:
        if self.mp_pool is not None:
            self.mp_pool.terminate()
            self.mp_pool = None


class RollQaEnv(_BySeed, QaEnv):
    def __init__(self, dataset_name: str = "", split: str | None = None, dataset: Any = None, question_key: str = "question",
                 answer_key: str = "answer", seed: int = 0, extract_boxed: bool = False, mode: str = "train", **kw: Any) -> None:
        dataset = _problems(dataset, dataset_name, split, question_key, answer_key)
        self.mode = mode
        super().__init__(dataset_name=dataset_name, split=split, dataset=dataset, question_key=question_key,
                         answer_key=answer_key, seed=seed, extract_boxed=extract_boxed, load_from_cache_file=False)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        data = self._pick(seed)
        self.first_obs, self.answer = str(data[self.question_key]), data[self.answer_key]
        return self.first_obs, {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        answer = self.extractor(action)
        if answer is None:
            return _outcome(False, 0.0)
        return _outcome(True, 1.0 if self.check_correct(answer, self.answer) else 0.0)


class RollCodeEnv(_BySeed, CodeEnv):
    """GEM's code env with problems chosen by seed and ROLL's metrics; the model's program runs on each test
    input in our sandbox (``envs.tools.sandbox``: limits, no network, its own PID namespace), not in GEM's
    plain subprocess. A test passes when the program exits cleanly and its output equals the expected one
    (surrounding whitespace ignored, as in GEM); the answer is right when every test passes. ``timeout`` is
    seconds per test; ``sandbox_type`` none or bwrap."""

    def __init__(self, dataset_name: str = "", split: str | None = None, dataset: Any = None, question_key: str = "problem",
                 test_key: str = "tests", seed: int = 0, mode: str = "train", max_tests: int = 12, timeout: float = 5,
                 sandbox_type: str = "none", **kw: Any) -> None:
        from envs.tools.sandbox import SandboxLimits, check_sandbox

        dataset = _problems(dataset, dataset_name, split, question_key, test_key)
        check_sandbox(sandbox_type)
        self.mode = mode
        self.limits = SandboxLimits(timeout=float(timeout), sandbox_type=sandbox_type)
        super().__init__(dataset_name=dataset_name, split=split, dataset=dataset, question_key=question_key,
                         test_key=test_key, seed=seed, max_tests=max_tests, sandbox_type=sandbox_type, max_workers=1)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        data = self._pick(seed)
        self.first_obs, self.tests = str(data[self.question_key]), data[self.test_key]
        if isinstance(self.tests, str):
            self.tests = json.loads(self.tests)
        return self.first_obs, {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        from gem.utils.parsing import extract_code_from_model

        code = extract_code_from_model(action)
        if code is None:
            return _outcome(False, 0.0)
        return _outcome(True, 1.0 if self.passes(code) else 0.0)

    def passes(self, code: str) -> bool:
        from envs.tools.sandbox import run_python

        tests = self.tests
        if not isinstance(tests, dict) or not {"inputs", "outputs"} <= set(tests):
            raise ValueError(f"{self.test_key} must be an object with 'inputs' and 'outputs' lists")
        pairs = sorted(zip(tests["inputs"], tests["outputs"]), key=lambda p: len(_text(p[0])), reverse=True)
        for given, expected in pairs[: self.max_tests]:  # the longest inputs, as GEM picks them
            result = run_python(code, self.limits, stdin=_text(given))
            if not result.ok or result.stdout.strip() != _text(expected).strip():
                return False
        return True


def _text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)
