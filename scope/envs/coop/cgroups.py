"""The cgroup (v1 or v2) a sandboxed call runs in: a process-count and a memory limit that bind root too
(per-user rlimits do not)."""
from __future__ import annotations

import os
import signal
import time
import uuid


class Cgroup:
    """A cgroup (v1 or v2) of one call: a process-count and a memory limit that bind root too."""

    def __init__(self, max_processes: int, memory_bytes: int):
        self.paths: list[str] = []
        name = f"scope-sandbox-{uuid.uuid4().hex[:12]}"
        if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):  # v2 only
            base = "/sys/fs/cgroup" + _own_cgroup("")
            p = os.path.join(base, name)
            os.mkdir(p)
            self.paths.append(p)
            _write(os.path.join(p, "pids.max"), str(max_processes))
            _write(os.path.join(p, "memory.max"), str(memory_bytes))
            _try_write(os.path.join(p, "memory.swap.max"), "0")
        else:
            for ctrl, files in (("pids", {"pids.max": str(max_processes)}),
                                ("memory", {"memory.limit_in_bytes": str(memory_bytes)})):
                base = os.path.join("/sys/fs/cgroup", ctrl) + _own_cgroup(ctrl)
                p = os.path.join(base, name)
                os.mkdir(p)
                self.paths.append(p)
                for f, v in files.items():
                    _write(os.path.join(p, f), v)
                if ctrl == "memory":
                    _try_write(os.path.join(p, "memory.memsw.limit_in_bytes"), str(memory_bytes))

    def enter(self) -> None:  # in the child, before exec
        for p in self.paths:
            _write(os.path.join(p, "cgroup.procs"), str(os.getpid()))

    def kill_all(self) -> None:
        for _ in range(50):
            pids: set[int] = set()
            for p in self.paths:
                try:
                    pids.update(int(x) for x in open(os.path.join(p, "cgroup.procs")).read().split())
                except OSError:
                    pass
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)

    def remove(self) -> None:
        self.kill_all()
        for p in self.paths:
            for _ in range(100):
                try:
                    os.rmdir(p)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def _own_cgroup(controller: str) -> str:
    for line in open("/proc/self/cgroup"):
        _, ctrls, path = line.rstrip("\n").split(":", 2)
        if (controller == "" and ctrls == "") or controller in ctrls.split(","):
            return path.rstrip("/")
    return ""


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _try_write(path: str, value: str) -> None:
    try:
        _write(path, value)
    except OSError:
        pass


def cgroups_usable() -> bool:
    try:
        Cgroup(8, 64 << 20).remove()
        return True
    except OSError:
        return False
