"""Kill a training run at random moments (SIGKILL, checkpoint writes included), resume it each time, and
check that it ends as a run that never stopped: every step's metrics exactly once with the same values,
the same final weights, and (population) the same pool. ``make test-soak`` runs this (SCOPE_SOAK_TESTS=1)."""
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import yaml

from scope.run import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILLS = 20
STEPS = 30  # more than 20: a killed start makes at most one step, so all 20 kills land before the run ends


def config(run_dir, population: bool) -> dict:
    partner = {"model": "policy", "max_new_tokens": 10}
    if population:
        partner.update(trainable=True, source="pool", pool={"size": 2, "every": 1}, reward="adversarial",
                       group_shared=False)
    return {"run": {"dir": str(run_dir), "save_every": 1, "keep_checkpoints": 2, "progress": False, "threads": 1},
            "models": {"policy": {"path": "tiny-random", "lora": {"r": 4, "alpha": 8}}},
            "agent": {"model": "policy", "trainable": True, "max_new_tokens": 10},
            "partner": partner,
            "env": {"name": "p4g", "options": {"max_turns": 2, "force_decision": True}},
            "rollout": {"n_tasks": 2, "group_size": 3, "end_on_truncation": False},
            "train": {"steps": STEPS, "lr": 1e-3}}


def scope(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "scope.cli", "train", *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finished(run_dir) -> bool:
    p = os.path.join(run_dir, "metrics.jsonl")
    return os.path.exists(p) and any(m.get("step") == STEPS for m in read_metrics(p))


def steps_done(run_dir) -> int:
    try:
        return len(read_metrics(os.path.join(run_dir, "metrics.jsonl")))
    except FileNotFoundError:
        return 0


def saving(run_dir, since: float) -> bool:
    """A checkpoint write begun after ``since`` is in progress (or was cut off)."""
    ck = os.path.join(run_dir, "checkpoints")
    try:
        return any(d.endswith(".tmp") and os.path.getmtime(os.path.join(ck, d)) >= since for d in os.listdir(ck))
    except FileNotFoundError:
        return False


def weights(run_dir):
    from safetensors.torch import load_file

    ck = os.path.join(run_dir, "checkpoints", f"step_{STEPS:06d}")
    out = {}
    for root, _, files in os.walk(ck):
        for f in files:
            if f.endswith(".safetensors"):
                out[os.path.relpath(os.path.join(root, f), ck)] = load_file(os.path.join(root, f))
    return out


@pytest.mark.parametrize("population", [False, True], ids=["plain", "population"])
def test_random_kills_never_lose_a_step(tmp_path, population):
    cfg_file = tmp_path / "cfg.yaml"
    straight, run = tmp_path / "straight", tmp_path / "run"
    cfg_file.write_text(yaml.safe_dump(config(straight, population)))
    p = scope("--config", str(cfg_file))
    assert p.wait(timeout=600) == 0, p.stderr.read()
    cfg_file.write_text(yaml.safe_dump(config(run, population)))
    rng = random.Random(1 if population else 0)
    kills, mid_save, starts = 0, 0, 0
    while not finished(run):
        starts += 1
        assert starts < 80, "the run makes no progress between kills"
        resume = os.path.exists(run / "config.yaml")
        t_start = time.time()
        p = scope(*(["--resume", str(run)] if resume else ["--config", str(cfg_file)]))
        if kills < KILLS:
            if kills % 2:  # at a random moment (start-up takes ~3 s: some kills land before the first step), and
                # at the latest when a new step's metrics appear, so a fast machine cannot finish the run in 20 kills
                done, deadline = steps_done(run), time.time() + rng.uniform(2.0, 7.0)
                while p.poll() is None and time.time() < deadline and steps_done(run) <= done:
                    time.sleep(0.01)
            else:  # while a checkpoint is being written: as soon as its step_N.tmp appears, after a random delay
                t0 = time.time()
                while p.poll() is None and time.time() - t0 < 60 and not saving(run, t_start):
                    time.sleep(0.0005)
                time.sleep(rng.uniform(0.0, 0.002))
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
                kills += 1
                mid_save += saving(run, t_start)
                continue
        assert p.wait(timeout=600) == 0, p.stderr.read()
    assert kills == KILLS and mid_save >= KILLS // 5  # many kills cut a checkpoint write short
    a, b = read_metrics(str(run)), read_metrics(str(straight))
    assert [m["step"] for m in a] == list(range(1, STEPS + 1))  # every step exactly once
    for x, y in zip(a, b):
        assert x["reward_mean"] == pytest.approx(y["reward_mean"], abs=1e-6), x["step"]
        assert x["tokens_generated"] == y["tokens_generated"]
    wa, wb = weights(run), weights(straight)
    assert set(wa) == set(wb) and wa
    for f in wa:
        for k in wa[f]:
            assert (wa[f][k] - wb[f][k]).abs().max() < 1e-6, (f, k)
    if population:
        import torch  # the pool's members, in order, are in the checkpoint state

        st = [torch.load(d / "checkpoints" / f"step_{STEPS:06d}" / "state.pt", weights_only=True)
              for d in (run, straight)]
        assert st[0]["sources"]["partner"]["members"] == st[1]["sources"]["partner"]["members"]
    print(f"{kills} kills, {mid_save} of them left a checkpoint half-written, {starts} starts")


DIST_KILLS = 8


def two_ranks(tmp_path, args, k: int) -> list[subprocess.Popen]:
    """Both ranks of a 2-rank run (a FileStore of its own, loopback), as torchrun would start them."""
    store = tmp_path / f"store{k}"
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), SCOPE_DIST_INIT=f"file://{store}",
                   GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-m", "scope.cli", "train", *args], cwd=ROOT, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    return procs


def test_random_kills_of_either_rank_of_a_two_rank_run_never_lose_a_step(tmp_path):
    """Co-Training over 2 ranks (agent FSDP2 over both, simulator on rank 1), a random rank SIGKILLed at random
    moments (checkpoint writes included): the other rank always ends with an error, never hangs, and the run
    resumed each time ends as a 2-rank run that never stopped."""
    def cfg(run_dir):
        c = config(run_dir, population=False)
        c["partner"].update(trainable=True, reward="adversarial")
        c["parallel"] = {"agent": {"strategy": "fsdp"}, "partner": {"ranks": [1], "strategy": "ddp"}, "timeout": 60}
        return c

    cfg_file = tmp_path / "cfg.yaml"
    straight, run = tmp_path / "straight", tmp_path / "run"
    cfg_file.write_text(yaml.safe_dump(cfg(straight)))
    ps = two_ranks(tmp_path, ["--config", str(cfg_file)], 0)
    assert [p.wait(timeout=600) for p in ps] == [0, 0], ps[0].stderr.read() + ps[1].stderr.read()
    cfg_file.write_text(yaml.safe_dump(cfg(run)))
    rng = random.Random(2)
    kills, mid_save, starts = 0, 0, 0
    while not finished(run):
        starts += 1
        assert starts < 40, "the run makes no progress between kills"
        resume = os.path.exists(run / "config.yaml")
        t_start = time.time()
        ps = two_ranks(tmp_path, ["--resume", str(run)] if resume else ["--config", str(cfg_file)], starts)
        if kills < DIST_KILLS:
            if kills % 2:  # at a random moment, at the latest when a new step's metrics appear
                done, deadline = steps_done(run), time.time() + rng.uniform(4.0, 9.0)
                while ps[0].poll() is None and time.time() < deadline and steps_done(run) <= done:
                    time.sleep(0.01)
            else:
                t0 = time.time()
                while ps[0].poll() is None and time.time() - t0 < 60 and not saving(run, t_start):
                    time.sleep(0.0005)
                time.sleep(rng.uniform(0.0, 0.02))
            victim = rng.randrange(2)
            if all(p.poll() is None for p in ps):
                ps[victim].send_signal(signal.SIGKILL)
                other = ps[1 - victim]
                code = other.wait(timeout=120)  # stops, loudly: not a hang, not a success
                assert code != 0, "the surviving rank ended as if nothing happened"
                ps[victim].wait()
                kills += 1
                mid_save += saving(run, t_start)
                continue
        assert [p.wait(timeout=600) for p in ps] == [0, 0], ps[0].stderr.read() + ps[1].stderr.read()
    assert kills == DIST_KILLS
    a, b = read_metrics(str(run)), read_metrics(str(straight))
    assert [m["step"] for m in a] == list(range(1, STEPS + 1))
    for x, y in zip(a, b):
        assert x["reward_mean"] == pytest.approx(y["reward_mean"], abs=1e-6), x["step"]
    wa, wb = weights(run), weights(straight)
    assert set(wa) == set(wb) and wa
    for f in wa:
        for k in wa[f]:
            assert (wa[f][k] - wb[f][k]).abs().max() < 1e-6, (f, k)
    print(f"2 ranks: {kills} kills, {mid_save} of them during a checkpoint write, {starts} starts")


ASYNC_KILLS = 6


def test_random_kills_of_an_asynchronous_run_never_lose_a_step(tmp_path):
    """rollout.max_staleness 1 (a generator thread a step ahead; a checkpoint every 2 steps, so odd steps overlap
    generation and training): killed at random moments (up to 6 times, at least 3) and resumed each time, every
    step is logged exactly once, no step trains on episodes more than one version old, and the run ends. (A
    resumed async run draws the same tasks again, but the generator's sampling stream starts afresh: its rewards
    are not compared with an uninterrupted run's.)"""
    c = config(tmp_path / "run", population=False)
    c["run"]["save_every"] = 2
    c["rollout"]["max_staleness"] = 1
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(yaml.safe_dump(c))
    run, rng = tmp_path / "run", random.Random(2)
    kills, starts = 0, 0
    while not finished(run):
        starts += 1
        assert starts < 40, "the run makes no progress between kills"
        p = scope(*(["--resume", str(run)] if (run / "config.yaml").exists() else ["--config", str(cfg_file)]))
        if kills < ASYNC_KILLS:
            time.sleep(rng.uniform(2.0, 4.5))  # start-up takes ~3 s: some kills land before the first step
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
                kills += 1
                continue
        assert p.wait(timeout=600) == 0, p.stderr.read()
    ms = read_metrics(str(run))
    assert [m["step"] for m in ms] == list(range(1, STEPS + 1))
    assert all(m["async/staleness_max"] <= 1 for m in ms) and kills >= 3
    print(f"{kills} kills of an asynchronous run, {starts} starts")
