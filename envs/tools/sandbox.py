"""Running model-written Python code: a separate process in a temporary folder, with limits.

Every run gets:
- its own process group in a fresh temporary folder (removed afterwards, whatever the code did), a
  wall-clock ``timeout`` after which the whole group is killed, and a CPU-time limit;
- resource limits: address space (``memory_mb``), processes and threads (``max_processes``; the kernel
  does not apply it to root), open files, and the size of any file it writes (``max_output_bytes``; its
  stdout and stderr are files too, so a 10 MB print is cut there and reported);
- no new processes (a seccomp filter refuses fork and clone, threads excepted; x86_64), so a fork bomb
  fails at its first fork, root or not; no capabilities, so it cannot raise its limits back;
- a scrubbed environment (no variable of the run reaches it) and, where the kernel allows it, PID and
  network namespaces of its own: it sees no process of the run (it cannot signal its parent) and no
  network interface but loopback.

It runs as the run's user: with ``sandbox_type: none`` it can read what the run can read.

``sandbox_type: none`` is the above. ``sandbox_type: bwrap`` also runs it under bubblewrap (Debian's
``bubblewrap`` package): a private filesystem view holding only the system's and Python's read-only
folders and the temporary folder, with fresh PID, IPC, UTS and network namespaces, so the run's
checkpoints and outputs are not even visible. A config that asks for bwrap on a machine without it is
refused at start (``check_sandbox``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SANDBOX_TYPES = ("none", "bwrap")
LAUNCHER = Path(__file__).with_name("sandbox_launch.py")


@dataclass(frozen=True)
class SandboxLimits:
    timeout: float = 5.0  # seconds of wall clock
    memory_mb: int = 1024
    max_processes: int = 32
    max_output_bytes: int = 1 << 16  # per file, stdout and stderr included
    open_files: int = 64
    sandbox_type: str = "none"


@dataclass(frozen=True)
class RunResult:
    ok: bool  # exited 0 within the limits
    stdout: str
    stderr: str
    elapsed_s: float
    timed_out: bool = False
    output_cut: bool = False


def check_sandbox(sandbox_type: str) -> None:
    """ValueError unless ``sandbox_type`` can run here."""
    if sandbox_type not in SANDBOX_TYPES:
        raise ValueError(f"sandbox_type {sandbox_type!r} is not one of {', '.join(SANDBOX_TYPES)}")
    if sandbox_type == "bwrap" and shutil.which("bwrap") is None:
        raise ValueError("sandbox_type bwrap needs bubblewrap, which is not installed (Debian/Ubuntu: "
                         "apt-get install bubblewrap); use sandbox_type none for the process sandbox alone")


def _environment(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8", "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _bwrap_prefix(workdir: str) -> list[str]:
    """bubblewrap arguments: read-only system and Python folders, the work folder, nothing else."""
    ro = {"/usr", "/bin", "/lib", "/lib64", "/etc/alternatives", "/etc/ld.so.cache", "/etc/localtime",
          sys.base_prefix, sys.prefix, sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
          str(LAUNCHER.parent)}
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--proc", "/proc", "--dev", "/dev",
            "--tmpfs", "/tmp"]
    for path in sorted(ro):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args + ["--bind", workdir, workdir, "--chdir", workdir]


def run_python(code: str, limits: SandboxLimits = SandboxLimits(), stdin: str = "") -> RunResult:
    """Run ``code`` under ``limits`` with ``stdin`` as its standard input; never raises for anything the code does."""
    check_sandbox(limits.sandbox_type)
    started = time.perf_counter()
    workdir = tempfile.mkdtemp(prefix="roll-sandbox-")
    try:
        code_path = os.path.join(workdir, "main.py")
        with open(code_path, "w", encoding="utf-8") as f:
            f.write(code)
        spec = {"cpu_s": max(1, int(limits.timeout) + 1), "memory_bytes": int(limits.memory_mb) << 20,
                "file_bytes": int(limits.max_output_bytes), "processes": int(limits.max_processes),
                "open_files": int(limits.open_files),
                # bwrap already gives the code PID and network namespaces of its own
                "isolate": limits.sandbox_type != "bwrap"}
        command = [sys.executable, "-I", str(LAUNCHER), code_path, workdir, json.dumps(spec)]
        if limits.sandbox_type == "bwrap":
            command = _bwrap_prefix(workdir) + command
        out_path, err_path = os.path.join(workdir, ".stdout"), os.path.join(workdir, ".stderr")
        in_path = os.path.join(workdir, ".stdin")
        with open(in_path, "w", encoding="utf-8") as f:
            f.write(stdin)
        with open(out_path, "wb") as out, open(err_path, "wb") as err, open(in_path, "rb") as given:
            proc = subprocess.Popen(command, stdin=given, stdout=out, stderr=err, cwd=workdir,
                                    env=_environment(workdir), start_new_session=True, close_fds=True)
            # a blocking wait returns the moment the code ends (Popen.wait(timeout=...) polls, with sleeps of up
            # to 50 ms); a timer kills the group at the deadline
            expired = threading.Event()
            timer = threading.Timer(limits.timeout, lambda: (expired.set(), _kill_group(proc, reap=False)))
            timer.start()
            try:
                proc.wait()
            finally:
                timer.cancel()
            timed_out = expired.is_set()
            _kill_group(proc)
        stdout, cut_out = _read_capped(out_path, limits.max_output_bytes)
        stderr, cut_err = _read_capped(err_path, limits.max_output_bytes)
        died_of = _signal_of(proc.returncode)
        cut = cut_out or cut_err or died_of == signal.SIGXFSZ
        if timed_out:
            stderr = (stderr + "\n" if stderr else "") + f"TimeoutError: the code ran longer than {limits.timeout:g} s"
        elif cut:
            stderr = (stderr + "\n" if stderr else "") + f"OutputLimit: the code wrote more than {limits.max_output_bytes} bytes"
        elif died_of:
            stderr = (stderr + "\n" if stderr else "") + f"Killed by signal {died_of.name}"
        ok = proc.returncode == 0 and not timed_out and not cut
        return RunResult(ok, stdout, stderr, time.perf_counter() - started, timed_out, cut)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _signal_of(returncode: int | None) -> signal.Signals | None:
    """The signal that ended the code: negative codes from Popen, 128+n from the namespace's init."""
    number = -returncode if returncode and returncode < 0 else returncode - 128 if returncode and returncode > 128 else 0
    try:
        return signal.Signals(number) if number else None
    except ValueError:
        return None


def _kill_group(proc: subprocess.Popen, reap: bool = True) -> None:
    """Kill the code's whole process group (children it left behind included) and reap the leader."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if not reap:
        return
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _read_capped(path: str, cap: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    return data[:cap].decode("utf-8", errors="replace"), len(data) > cap
