"""Runs one piece of model-written Python inside the limits the sandbox asked for (started by
``envs.tools.sandbox``, never imported by the library).

argv: the code file, the working folder, and a JSON object of limits. Order matters:
1. new PID and network namespaces are made first (they need the privileges dropped below): the code then
   sees no process of the run (it cannot signal its parent) and no network interface but loopback;
2. a small init process of the namespace waits for the code's process, so that when either ends the kernel
   ends every process the code left behind;
3. the code's process sets its resource limits, drops every capability (bounding set included, with
   no_new_privs), so even as root it can raise no limit again, and installs a seccomp filter that refuses
   new processes (fork, vfork, clone without CLONE_THREAD; clone3 answers ENOSYS so libc falls back to
   clone): the kernel exempts root from RLIMIT_NPROC, so a fork bomb is stopped here. Threads stay
   allowed. Then it runs the code as ``__main__``.
"""

import ctypes
import json
import os
import platform
import resource
import struct
import sys

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
LAST_CAP = 63
LINUX_CAPABILITY_VERSION_3 = 0x20080522
SYS_CAPSET = 126  # x86_64
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
AUDIT_ARCH_X86_64 = 0xC000003E
SYS_CLONE, SYS_FORK, SYS_VFORK, SYS_CLONE3 = 56, 57, 58, 435  # x86_64
CLONE_THREAD = 0x00010000
EPERM, ENOSYS = 1, 38


def unshare(libc: ctypes.CDLL) -> bool:
    flags = CLONE_NEWPID | CLONE_NEWNET
    if os.geteuid() != 0:
        flags |= CLONE_NEWUSER  # an unprivileged process may make these inside a user namespace of its own
    return libc.unshare(flags) == 0


def drop_capabilities(libc: ctypes.CDLL) -> None:
    for cap in range(LAST_CAP + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # fails harmlessly for caps the kernel does not know
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: all empty (two 32-bit words each)
    libc.syscall(SYS_CAPSET, ctypes.byref(header), ctypes.byref(data))


def _bpf(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def refuse_new_processes(libc: ctypes.CDLL) -> bool:
    """A seccomp filter: fork/vfork and clone without CLONE_THREAD fail with EPERM, clone3 with ENOSYS."""
    if platform.machine() != "x86_64":
        return False  # the syscall numbers below are x86_64's; elsewhere RLIMIT_NPROC is the only bound
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    allow, deny, nosys = 0x7FFF0000, 0x00050000 | EPERM, 0x00050000 | ENOSYS
    # jumps are relative: a taken branch goes to line (this line + 1 + offset)
    program = b"".join([
        _bpf(ld, 0, 0, 4),                   # 0: the architecture
        _bpf(jeq, 0, 7, AUDIT_ARCH_X86_64),  # 1: not x86_64 -> 9 (allow)
        _bpf(ld, 0, 0, 0),                   # 2: the syscall number
        _bpf(jeq, 6, 0, SYS_FORK),           # 3: fork -> 10 (EPERM)
        _bpf(jeq, 5, 0, SYS_VFORK),          # 4: vfork -> 10 (EPERM)
        _bpf(jeq, 5, 0, SYS_CLONE3),         # 5: clone3 -> 11 (ENOSYS)
        _bpf(jeq, 0, 2, SYS_CLONE),          # 6: not clone -> 9 (allow)
        _bpf(ld, 0, 0, 16),                  # 7: clone's flags (the low half of its first argument)
        _bpf(jset, 0, 1, CLONE_THREAD),      # 8: a thread -> 9 (allow), else -> 10 (EPERM)
        _bpf(ret, 0, 0, allow),              # 9
        _bpf(ret, 0, 0, deny),               # 10
        _bpf(ret, 0, 0, nosys),              # 11
    ])
    buffer = ctypes.create_string_buffer(program)
    fprog = struct.pack("HxxxxxxP", len(program) // 8, ctypes.addressof(buffer))
    return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0) == 0


def run_code(libc: ctypes.CDLL, code_path: str, workdir: str, limits: dict) -> None:
    for name, value in (("RLIMIT_CPU", limits["cpu_s"]), ("RLIMIT_AS", limits["memory_bytes"]),
                        ("RLIMIT_FSIZE", limits["file_bytes"]), ("RLIMIT_NPROC", limits["processes"]),
                        ("RLIMIT_NOFILE", limits["open_files"]), ("RLIMIT_CORE", 0)):
        resource.setrlimit(getattr(resource, name), (value, value))
    drop_capabilities(libc)
    refuse_new_processes(libc)
    os.chdir(workdir)
    sys.argv = [code_path]
    sys.path[0] = workdir
    with open(code_path, encoding="utf-8") as f:
        source = f.read()
    exec(compile(source, code_path, "exec"), {"__name__": "__main__", "__file__": code_path})  # noqa: S102 - the sandboxed code


def wait_exit(pid: int) -> None:
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(128 - code if code < 0 else code)  # a signal death reads as 128 + signal number


def main() -> None:
    code_path, workdir, limits = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    libc = ctypes.CDLL(None, use_errno=True)
    if limits.get("isolate", True) and unshare(libc):
        sys.stdout.flush()
        init = os.fork()  # the first child is PID 1 of the new namespace
        if init:
            wait_exit(init)
        worker = os.fork()
        if worker:
            wait_exit(worker)
    run_code(libc, code_path, workdir, limits)


if __name__ == "__main__":
    main()
