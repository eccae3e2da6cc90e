"""The learner on torch.distributed (scope.parallel), on the CPU with gloo: N processes started here with RANK,
WORLD_SIZE and a FileStore (no TCP listener), GLOO_SOCKET_IFNAME=lo.

- one update of scope's own learner on the same batch in 1 and 2 ranks: the same gradient norm and weights, for
  LoRA and full fine-tuning, with DDP and FSDP2;
- Co-Training and Population Co-Training with the agent on rank 0 and the simulator on rank 1: the same rewards
  and weights as one process;
- a checkpoint of 2 ranks resumed by 1 and one of 1 resumed by 2 (DCP reshards);
- a rank killed mid-run ends the job with an error and leaves the last checkpoint whole."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import dist_worker
from scope.config import parse_config
from scope.run import read_metrics
from scope.train import train

HERE = os.path.dirname(os.path.abspath(__file__))  # (dist_worker.py lives here)
TOL = 2e-5


def launch(tmp, spec: dict, n: int = 2, name: str = "job", kill: tuple[int, float] | None = None,
           timeout: float = 240) -> list[int]:
    """Start ``n`` ranks of ``dist_worker.py`` on ``spec``; with ``kill`` = (rank, seconds), SIGKILL that rank
    once that many seconds have passed. Returns the exit codes."""
    spec_path = os.path.join(tmp, f"{name}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    store = os.path.join(tmp, f"{name}.store")
    if os.path.exists(store):
        os.remove(store)
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), SCOPE_DIST_INIT=f"file://{store}",
                   GLOO_SOCKET_IFNAME="lo", PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")  # a rank that aborts logs where it was
        log = open(os.path.join(tmp, f"{name}.rank{r}.log"), "w")
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "dist_worker.py"), spec_path], env=env,
                                      stdout=log, stderr=subprocess.STDOUT))
    t0 = time.time()
    killed = False
    while any(p.poll() is None for p in procs):
        if kill is not None and not killed and time.time() - t0 > kill[1]:
            procs[kill[0]].send_signal(signal.SIGKILL)
            killed = True
        if time.time() - t0 > timeout:
            for p in procs:
                p.kill()
            raise AssertionError(f"{name}: ranks still running after {timeout}s: "
                                 + _logs(tmp, name, n))
        time.sleep(0.2)
    return [p.returncode for p in procs]


def _logs(tmp, name, n):
    return "\n".join(f"--- rank {r}:\n" + open(os.path.join(tmp, f"{name}.rank{r}.log")).read()[-3000:]
                     for r in range(n))


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("shared", [0, 40], ids=["apart", "shared_prompt"])
@pytest.mark.parametrize("finetune,strategy", [("lora", "ddp"), ("lora", "fsdp"), ("full", "fsdp"),
                                               ("full", "ddp")])
def test_one_update_on_two_ranks_equals_one_process(tmp_path, finetune, strategy, shared):
    """``shared``: every trace begins with one 40-token prompt, which one process runs once a micro-batch
    (micro-batches of up to 400 tokens, so that several traces share one)."""
    from scope.learner import Learner, shared_prefix

    mbt = 400 if shared else 40
    b, adapter, lc = dist_worker.learner_parts(finetune, mbt)
    before = dist_worker.trained(b, adapter)
    learner = Learner(b, adapter, lc)
    # FSDP2 runs the trained pass row by row (Learner.share_prefix): the one-process run does the same here, as
    # Adam turns the rounding between the two ways (equal within rounding, tests/test_learner.py) into steps
    learner.share_prefix = strategy != "fsdp"
    traces, advs = dist_worker.batch(len(b.tokenizer), shared=shared)
    assert (shared_prefix(traces) > 0) == bool(shared)
    m1 = learner.update(traces, advs)
    one = dist_worker.trained(b, adapter)
    codes = launch(str(tmp_path), {"kind": "update", "finetune": finetune, "strategy": strategy,
                                   "out": str(tmp_path), "shared": shared, "micro_batch_tokens": mbt},
                   name=f"{finetune}_{strategy}")
    assert codes == [0, 0], _logs(str(tmp_path), f"{finetune}_{strategy}", 2)
    two = torch.load(tmp_path / "rank0.pt", weights_only=False)
    assert _max_diff(before, one) > 1e-3  # the update moved the weights
    if not shared:
        assert _max_diff(one, two["weights"]) < TOL
    else:  # micro-batches of several rows, split otherwise across ranks: the sums run in another order, and
        # Adam turns that rounding in a near-zero gradient into a step of up to lr; the gaps stay a small part
        # of how far the weights moved (and the gradients' norms agree below)
        apart = sum(float((one[k] - two["weights"][k]).abs().sum()) for k in one)
        moved = sum(float((one[k] - before[k]).abs().sum()) for k in one)
        assert _max_diff(one, two["weights"]) < lc.lr and apart < 1e-3 * moved, (apart, moved)
    m2 = two["metrics"]
    assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-4)  # gradients, not only Adam's steps
    for k in ("loss", "kl", "entropy", "trained_tokens", "trained_sequences"):
        assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), k
    assert "rank1/agent/update_seconds" not in m2  # (a bare learner: the timings come with the weight sync)


def test_shares_are_balanced_by_tokens_and_cover_every_trace():
    from scope.parallel import shares

    traces, advs = dist_worker.batch(2000, n=7)
    items = list(zip(traces, advs))
    s = shares(items, 3)
    assert sorted(i for x in s for i in x) == list(range(7))
    load = [sum(len(items[i][0].token_ids) for i in x) for x in s]
    assert max(load) - min(load) <= max(len(t.token_ids) for t in traces)


def cotrain_config(run_dir, partner: dict, steps: int = 3, parallel: dict | None = None, save_every: int = 1):
    data = {
        "run": {"dir": str(run_dir), "save_every": save_every, "progress": False, "keep_checkpoints": 5},
        "models": {"policy": {"path": "tiny-random", "lora": {"r": 4, "alpha": 8}}},
        "agent": {"model": "policy", "trainable": True, "max_new_tokens": 8},
        "partner": {"model": "policy", "max_new_tokens": 8, "trainable": True, "reward": "adversarial", **partner},
        "env": {"name": "p4g", "options": {"max_turns": 2, "force_decision": True}},
        "rollout": {"n_tasks": 2, "group_size": 3, "end_on_truncation": False},
        "train": {"steps": steps, "lr": 1e-2, "micro_batch_tokens": 64}}
    if parallel is not None:
        data["parallel"] = parallel
    return data


def _adapters(ck):
    from peft.utils import load_peft_weights

    out = {}
    for role in ("agent", "partner"):
        d = os.path.join(ck, role, role)
        if os.path.isdir(d):
            out.update({f"{role}.{k}": v for k, v in load_peft_weights(d).items()})
    return out


@pytest.mark.parametrize("partner", [{}, {"source": "pool", "pool": {"size": 2, "every": 1}, "group_shared": False}],
                         ids=["cotrain", "population"])
def test_cotraining_with_agent_and_simulator_on_disjoint_ranks_equals_one_process(tmp_path, partner):
    one = tmp_path / "one"
    train(parse_config(cotrain_config(one, partner)), log=lambda s: None)
    two = tmp_path / "two"
    placement = {"agent": {"ranks": [0], "strategy": "ddp"}, "partner": {"ranks": [1], "strategy": "fsdp"}}
    codes = launch(str(tmp_path), {"kind": "train", "config": cotrain_config(two, partner, parallel=placement)},
                   name="cotrain")
    assert codes == [0, 0], _logs(str(tmp_path), "cotrain", 2)
    m1, m2 = read_metrics(str(one)), read_metrics(str(two))
    assert [m["reward_mean"] for m in m1] == pytest.approx([m["reward_mean"] for m in m2], abs=1e-6)
    assert [m["partner/reward_mean"] for m in m1] == pytest.approx([m["partner/reward_mean"] for m in m2], abs=1e-6)
    assert m2[-1]["rank1/partner/update_seconds"] > 0 and m2[-1]["rank0/agent/update_seconds"] > 0
    assert m2[-1]["rank1/rss_gb"] > 0
    ck = "checkpoints/step_000003"
    assert _max_diff(_adapters(one / ck), _adapters(two / ck)) < 1e-4
    assert os.path.isdir(two / ck / "dist_agent") and os.path.isdir(two / ck / "dist_partner")


def test_a_trained_environment_simulator_on_its_own_rank_equals_one_process(tmp_path):
    """A trainable ``envsim`` (tau2 with simulated tools) is a trained model like the partner: with the agent on
    rank 0 and the simulator on rank 1 (``parallel.envsim``) it trains as in one process."""
    shared = os.path.join(HERE, "..", "..", "..", "shared", "data", "tau2")
    if not os.path.isdir(shared):
        pytest.skip(f"{shared} is missing")

    def cfg(run_dir, parallel=None):
        data = {"run": {"dir": str(run_dir), "save_every": 1, "progress": False},
                "models": {"policy": {"path": "tiny-random", "lora": {"r": 4, "alpha": 8}}},
                "agent": {"model": "policy", "trainable": True, "max_new_tokens": 8},
                "partner": {"model": "policy", "max_new_tokens": 8},
                "envsim": {"model": "policy", "trainable": True, "max_new_tokens": 16},
                "env": {"name": "tau2_retail", "options": {"data_dir": os.path.abspath(shared), "tools": "simulated",
                                                            "max_steps": 6}},
                "rollout": {"n_tasks": 2, "group_size": 2, "end_on_truncation": False},
                "train": {"steps": 2, "lr": 1e-2, "micro_batch_tokens": 64}}
        if parallel is not None:
            data["parallel"] = parallel
        return data

    one = tmp_path / "one"
    train(parse_config(cfg(one)), log=lambda s: None)
    two = tmp_path / "two"
    placement = {"agent": {"ranks": [0]}, "envsim": {"ranks": [1]}}
    codes = launch(str(tmp_path), {"kind": "train", "config": cfg(two, placement)}, name="envsim")
    assert codes == [0, 0], _logs(str(tmp_path), "envsim", 2)
    m1, m2 = read_metrics(str(one)), read_metrics(str(two))
    assert [m["reward_mean"] for m in m1] == pytest.approx([m["reward_mean"] for m in m2], abs=1e-6)
    assert m2[-1]["rank1/envsim/update_seconds"] > 0 and "envsim/train/trained_sequences" in m2[-1]


def test_resume_across_world_sizes(tmp_path):
    """3 steps in one go (one process) against 2 steps then a resume to 3: 2 ranks -> 1 and 1 -> 2 ranks, FSDP2."""
    placement = {"agent": {"strategy": "fsdp"}, "partner": {"strategy": "fsdp"}}
    ref = tmp_path / "ref"
    train(parse_config(cotrain_config(ref, {}, steps=3)), log=lambda s: None)
    want = _adapters(ref / "checkpoints/step_000003")
    # 2 ranks for two steps, then one process
    a = tmp_path / "a"
    codes = launch(str(tmp_path), {"kind": "train", "config": cotrain_config(a, {}, steps=2, parallel=placement)},
                   name="a2")
    assert codes == [0, 0], _logs(str(tmp_path), "a2", 2)
    train(parse_config(cotrain_config(a, {}, steps=3)), resume=True, log=lambda s: None)
    assert _max_diff(want, _adapters(a / "checkpoints/step_000003")) < 1e-4
    # one process for two steps, then 2 ranks
    b = tmp_path / "b"
    train(parse_config(cotrain_config(b, {}, steps=2)), log=lambda s: None)
    codes = launch(str(tmp_path), {"kind": "train", "config": cotrain_config(b, {}, steps=3, parallel=placement),
                                   "resume": True}, name="b2")
    assert codes == [0, 0], _logs(str(tmp_path), "b2", 2)
    assert _max_diff(want, _adapters(b / "checkpoints/step_000003")) < 1e-4
    assert [m["reward_mean"] for m in read_metrics(str(b))] == pytest.approx(
        [m["reward_mean"] for m in read_metrics(str(ref))], abs=1e-6)


@pytest.mark.parametrize("victim", [0, 1])
def test_a_killed_rank_stops_the_job_and_keeps_the_last_checkpoint(tmp_path, victim):
    """SIGKILL one rank once the run is under way: the other ends with an error (not a hang), and the newest
    published checkpoint is whole: its state, its sharded training state, and a one-process resume of it."""
    run = tmp_path / f"k{victim}"
    cfg = cotrain_config(run, {}, steps=200, parallel={"agent": {"strategy": "fsdp"}, "timeout": 60})
    codes = launch(str(tmp_path), {"kind": "train", "config": cfg}, name=f"kill{victim}", kill=(victim, 25),
                   timeout=200)
    assert codes[victim] == -signal.SIGKILL
    assert codes[1 - victim] not in (0, None), _logs(str(tmp_path), f"kill{victim}", 2)
    published = [d for d in sorted(os.listdir(run / "checkpoints")) if d.startswith("step_") and "." not in d]
    assert published, os.listdir(run / "checkpoints")
    last = run / "checkpoints" / published[-1]
    assert (last / "dist_agent" / ".metadata").exists() and (last / "dist_partner" / ".metadata").exists()
    step = int(published[-1][5:])
    assert torch.load(last / "state.pt", weights_only=True)["step"] == step
    data = cotrain_config(run, {}, steps=step + 1)
    train(parse_config(data), resume=True, log=lambda s: None)  # the checkpoint resumes
    assert read_metrics(str(run))[-1]["step"] == step + 1


def test_full_fine_tuning_over_two_ranks_reaches_the_generation_copy(tmp_path):
    """The agent fully fine-tuned with FSDP2 over both ranks: the weights that come back into rank 0's
    generation copy (and so the next rollouts and the saved weights) are the one-process run's."""
    def config(run_dir, parallel=None):
        data = cotrain_config(run_dir, {"trainable": False}, steps=2)
        data["models"]["policy"] = {"path": "tiny-random", "finetune": "full"}
        data["train"]["lr"] = 1e-3
        if parallel:
            data["parallel"] = parallel
        return data

    one, two = tmp_path / "one", tmp_path / "two"
    train(parse_config(config(one)), log=lambda s: None)
    codes = launch(str(tmp_path), {"kind": "train", "config": config(two, {"agent": {"strategy": "fsdp"}})},
                   name="full")
    assert codes == [0, 0], _logs(str(tmp_path), "full", 2)
    assert [m["reward_mean"] for m in read_metrics(str(one))] == pytest.approx(
        [m["reward_mean"] for m in read_metrics(str(two))], abs=1e-6)
    from safetensors.torch import load_file

    w1 = load_file(str(one / "checkpoints/step_000002/agent/model.safetensors"))
    w2 = load_file(str(two / "checkpoints/step_000002/agent/model.safetensors"))
    from scope.models.loading import load_tokenizer, tiny_backend

    w0 = tiny_backend(load_tokenizer("tiny-random"), seed=0).model.state_dict()
    moved = sum(float((w1[k] - w0[k]).abs().sum()) for k in w1)
    apart = sum(float((w1[k] - w2[k]).abs().sum()) for k in w1)
    # Adam turns float rounding in a near-zero gradient into a step of up to lr: the largest gap is under one
    # step (1e-3) and the gaps together are a small part of how far the weights moved
    assert _max_diff(w1, w2) < 1e-3 and apart < 1e-3 * moved, (apart, moved)
