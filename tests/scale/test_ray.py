"""Ray rollout workers on a local Ray instance bound to 127.0.0.1 (`make test-scale`)."""
import os
import subprocess

import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read when ray is imported: listen on 127.0.0.1 only
pytest.importorskip("ray")

from scope.config import parse_config  # noqa: E402
from scope.run import read_metrics  # noqa: E402
from scope.train import train  # noqa: E402


def cfg(run_dir, workers, steps=2, temperature=0.0, path="tiny-random", pool=False):
    partner = {"model": "policy", "max_new_tokens": 10, "temperature": temperature}
    if pool:
        partner.update(trainable=True, reward="curriculum", source="pool", pool={"size": 2, "every": 1})
    return parse_config({
        "run": {"dir": str(run_dir), "save_every": 1000, "progress": False},
        "models": {"policy": {"path": path}},
        "agent": {"model": "policy", "trainable": True, "max_new_tokens": 10, "temperature": temperature},
        "partner": partner,
        "env": {"name": "p4g", "options": {"max_turns": 2, "force_decision": True}},
        "rollout": {"n_tasks": 2, "group_size": 2, "end_on_truncation": False, "workers": workers},
        "ray": {"threads_per_worker": 1},
        "train": {"steps": steps, "lr": 1e-3}})


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    import ray

    yield
    if ray.is_initialized():
        ray.shutdown()


def tokens(run_dir):
    import json

    out = []
    for step in (1, 2):
        recs = [json.loads(x) for x in open(os.path.join(run_dir, "rollouts", f"step_{step:06d}.jsonl"))]
        out.append(sorted((r["group_id"], r["copy"], json.dumps(r["messages"])) for r in recs))
    return out


def test_two_workers_give_the_same_greedy_tokens_as_in_process(tmp_path):
    """Greedy decoding, fixed seed: 2 steps through 2 Ray workers produce the same dialogues as in-process,
    including step 2, whose adapter the workers received from the driver after step 1's update."""
    train(cfg(tmp_path / "local", 0), log=lambda s: None)
    train(cfg(tmp_path / "ray", 2), log=lambda s: None)
    assert tokens(tmp_path / "local") == tokens(tmp_path / "ray")
    ms = read_metrics(str(tmp_path / "ray"))
    assert [m["step"] for m in ms] == [1, 2] and all(m["failed_episodes"] == 0 for m in ms)
    assert ms[-1]["ray/weight_syncs"] >= 4  # the agent adapter to both workers, twice
    local = read_metrics(str(tmp_path / "local"))
    assert [m["reward_mean"] for m in local] == [m["reward_mean"] for m in ms]


def test_ray_binds_to_loopback_only(tmp_path):
    import ray

    train(cfg(tmp_path / "r", 2, steps=1), log=lambda s: None)
    assert ray.is_initialized()
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
    ray_lines = [ln for ln in out.splitlines() if any(k in ln for k in ("raylet", "gcs_server", "ray::", "python"))]
    assert ray_lines
    bad = [ln for ln in ray_lines
           if not any(a in ln.split()[3] for a in ("127.0.0.1:", "[::1]:", "[::ffff:127.0.0.1]:"))]
    assert not bad, bad


def test_pool_members_reach_the_workers(tmp_path):
    """Population Co-Training through 2 workers: pool members (adapters made on the driver) are sent and
    evicted members deleted; the run completes with no failed episode."""
    train(cfg(tmp_path / "p", 2, steps=3, temperature=0.7, pool=True), log=lambda s: None)
    ms = read_metrics(str(tmp_path / "p"))
    assert all(m["failed_episodes"] == 0 for m in ms) and ms[-1]["partner/pool_size"] == 2


def test_a_dead_worker_fails_its_episodes_and_the_step_goes_on(tmp_path):
    import ray

    from scope.rollout_workers import RayRollout
    from scope.setup import build_models
    from scope.train import TaskSampler, step_jobs
    import random

    c = cfg(tmp_path / "k", 2)
    backends, sources, _ = build_models(c)
    rr = RayRollout(c, backends)
    from scope.envs.base import get_env

    tasks = get_env("p4g").load_tasks("train")
    jobs = step_jobs(c, TaskSampler(tasks, 0).next(2), sources, 1, random.Random(0))
    ray.kill(rr.workers[0])
    eps, _ = rr(jobs, max_context=4096, end_on_truncation=False)
    failed = [e for e in eps if e.status == "failed"]
    assert len(failed) == len(jobs[0::2]) and all("rollout worker 0" in e.error for e in failed)
    assert all(e.status != "failed" for e in eps[1::2])
    assert rr.stats["restarts"] == 1
    jobs = step_jobs(c, TaskSampler(tasks, 1).next(2), sources, 2, random.Random(1))
    eps, _ = rr(jobs, max_context=4096, end_on_truncation=False)  # the restarted worker serves again
    assert all(e.status != "failed" for e in eps)
    rr.close()


TOL = 1e-4  # nats: a worker's sampling log-probs vs the driver's teacher-forced ones (fp32, same CPU kernels)


def test_sampled_logprobs_from_workers_match_the_learners(tmp_path):
    """Sampling at temperature 0.7 through 2 Ray workers, on an agent adapter the driver moved (so the
    workers sample with weights they were sent): every log-prob a worker recorded for its sampled tokens
    equals the learner's teacher-forced one on the driver within TOL, for both roles' traces."""
    import random

    import torch

    from scope.rollout_workers import make_rollout
    from scope.envs.base import get_env
    from scope.learner import Learner, LearnerConfig
    from scope.setup import build_models
    from scope.train import step_jobs

    c = cfg(tmp_path / "run", 2, temperature=0.7)
    backends, sources, trainable = build_models(c)
    agent = trainable["agent"]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # an "update": the adapter now differs from the base
        for n, p in agent.backend.model.named_parameters():
            if ".agent." in n and "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    agent.backend.versions["agent"] += 1
    rollout = make_rollout(c, backends)
    jobs = step_jobs(c, get_env("p4g").load_tasks("train")[:2], sources, 1, random.Random(0))
    episodes, _ = rollout(jobs, max_context=c.rollout.max_context, end_on_truncation=False)
    assert rollout.stats["weight_syncs"] == 2 and all(e.status != "failed" for e in episodes)
    learner = Learner(agent.backend, "agent", LearnerConfig(temperature=0.7))
    checked = 0
    for role, adapter in (("agent", "agent"), ("partner", None)):
        for e in episodes:
            ids, att, sel, old = learner._batch([e.traces[role]])
            with torch.no_grad(), agent.backend.using(adapter):
                new = learner._token_logprobs(agent.backend.model, ids, att, sel)[0]
            assert len(new) == len(old) > 0
            assert float((new - old).abs().max()) < TOL, (role, e.group_id, e.copy)
            checked += len(old)
    assert checked > 20


@pytest.mark.parametrize("stale", ["drop", "finish"])
def test_asynchronous_rollouts_through_workers(tmp_path, stale):
    """rollout.max_staleness: 1 with 2 workers, Co-Training (both models trained, each with its own versions) and
    a population pool: the next step's dialogues play on the adapters sent before this step's update; with
    ``finish`` the workers take the newer ones up between turns (offered while a batch plays)."""
    import json

    c = cfg(tmp_path / "a", 2, steps=4, temperature=0.7, pool=True).model_copy(deep=True)
    c.rollout.max_staleness, c.rollout.stale = 1, stale
    train(c, log=lambda s: None)
    ms = read_metrics(str(tmp_path / "a"))
    assert all(m["failed_episodes"] == 0 for m in ms)
    assert [m["async/staleness_max"] for m in ms] == [0.0, 1.0, 1.0, 1.0]
    assert all(m["async/dropped_episodes"] == 0 for m in ms)
    recs = [json.loads(x) for x in open(tmp_path / "a" / "rollouts" / "step_000003.jsonl")]
    versions = {v for r in recs for _, v in r["models"]["agent"]}
    assert versions == {1} if stale == "drop" else versions <= {1, 2}
