"""Per-call overhead of the python tool's sandbox, against GEM's own code runner in the same run.

    .venv/bin/python scripts/bench/sandbox.py [--calls 30]

Each call runs a one-line program (print 6*7) and returns its output; the figure is the median wall time
of a call, i.e. what a tool call costs beyond the code itself. Rows: our sandbox (sandbox_type none and,
where bubblewrap is installed, bwrap) and GEM 0.0.4's ``gem.utils.sandbox.run_python`` (sandbox_type none:
a plain subprocess, no limits), which ROLL's python_code tool calls.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from envs.tools.sandbox import SandboxLimits, run_python  # noqa: E402

CODE = "print(6 * 7)"


def timed(fn, calls: int) -> tuple[float, float]:
    fn()  # warm-up (page cache, imports)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000, max(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    rows = []

    def ours(kind: str):
        def call() -> None:
            result = run_python(CODE, SandboxLimits(timeout=5, sandbox_type=kind))
            assert result.ok and result.stdout.strip() == "42", result
        return call

    rows.append(("roll sandbox, sandbox_type none", *timed(ours("none"), args.calls)))
    if shutil.which("bwrap"):
        rows.append(("roll sandbox, sandbox_type bwrap", *timed(ours("bwrap"), args.calls)))
    try:
        from gem.utils.sandbox import run_python as gem_run_python

        def gem_call() -> None:
            ok, out, err = gem_run_python(CODE, "none", timeout=5)
            assert ok and out.strip() == "42", (ok, out, err)

        rows.append(("GEM 0.0.4 run_python (baseline, no limits)", *timed(gem_call, args.calls)))
    except ImportError:
        print("gem-llm is not installed: no baseline row")
    print(f"{'runner':48s} {'median ms':>10s} {'max ms':>8s}   ({args.calls} calls each)")
    for name, median, worst in rows:
        print(f"{name:48s} {median:10.1f} {worst:8.1f}")


if __name__ == "__main__":
    main()
