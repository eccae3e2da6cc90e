"""coop_coding: the shipped suite graded through the full pipeline, the environment driven by scripted
agents that type known-good commands, and the tiny model through the rollout engine (token plumbing)."""
import json
import os
import random

import pytest

from scope.envs.base import get_env
from scope.envs.coop import sandbox as sb
from scope.envs.coop.env import CoopCoding, parse_action
from scope.envs.coop.evaluate import evaluate_pair
from scope.envs.coop.sandbox import Limits, Sandbox
from scope.envs.coop.tasks import SUITE, load_pairs, load_task_dir, task_dirs

needs_bwrap = pytest.mark.skipif(sb.find_bwrap() is None or (os.geteuid() == 0 and not sb.cgroups_usable()),
                                 reason="no usable sandbox (bubblewrap, and as root a writable cgroup filesystem)")


def box(ws):
    return Sandbox(ws, Limits(wall_seconds=120))


def test_the_suite_has_the_layout_and_the_variety_asked_for():
    dirs = task_dirs(SUITE)
    repos = {d.split("/")[0] for d in dirs}
    pairs = load_pairs(None, "train") + load_pairs(None, "test")
    assert len(repos) >= 4 and len(pairs) >= 20
    assert {p.id for p in load_pairs(None, "train")}.isdisjoint({p.id for p in load_pairs(None, "test")})
    for d in dirs:
        for f in load_task_dir(os.path.join(SUITE, d))["features"]:
            assert f["description"].strip() and f["reference_patch"] and f["tests_patch"]
    manifest = json.load(open(os.path.join(SUITE, "pairs.json")))
    assert set(manifest) == {p.id for p in pairs}
    kinds = {(m["merge"], m["reference_success"]) for m in manifest.values()}
    # clean merges, conflicts a union merge resolves, and conflicts whose union is broken code
    assert {("clean", True), ("union", True), ("union", False)} <= kinds


@needs_bwrap
# one pair here; the other three in `make test-long` (about 20 s each on 2 cores)
@pytest.mark.parametrize("repo", ["textkit"] + [pytest.param(r, marks=pytest.mark.long)
                                  for r in ("inventory", "settings", "stats")])
def test_every_reference_pair_through_the_full_pipeline(repo):
    """Each pair of reference patches gives what the manifest says (success, or a broken union merge that
    only a coordinated patch avoids); dropping one feature's patch, or breaking one, fails the pair."""
    manifest = json.load(open(os.path.join(SUITE, "pairs.json")))
    pairs = [p for p in load_pairs(None, "train") + load_pairs(None, "test") if p.id.startswith(f"{repo}_task/")]
    assert pairs
    for p in pairs:
        fa, fb = p.data["features"]
        tests = {fa["name"]: fa["tests_patch"], fb["name"]: fb["tests_patch"]}
        r = evaluate_pair(p.data["repo_dir"], {"agent1": fa["reference_patch"], "agent2": fb["reference_patch"]},
                          tests, box)
        want = manifest[p.id]
        assert (r.merge.status, r.success) == (want["merge"], want["reference_success"]), p.id
        if not r.success:  # coordination: the combined patch passes both features
            c = evaluate_pair(p.data["repo_dir"], {"agent1": p.data["combined_patch"], "agent2": ""}, tests, box)
            assert c.success, p.id
    p = pairs[0]
    fa, fb = p.data["features"]
    tests = {fa["name"]: fa["tests_patch"], fb["name"]: fb["tests_patch"]}
    r = evaluate_pair(p.data["repo_dir"], {"agent1": fa["reference_patch"], "agent2": ""}, tests, box)
    assert not r.success and r.features[fa["name"]].ok and not r.features[fb["name"]].ok
    broken = fb["reference_patch"].replace("\n+    ", "\n+    raise RuntimeError('broken')\n+    ", 1)
    r = evaluate_pair(p.data["repo_dir"], {"agent1": fa["reference_patch"], "agent2": broken}, tests, box)
    assert not r.success


def test_actions_are_parsed():
    assert parse_action("I will look.\n```bash\nls -la\n```") == ("bash", "ls -la")
    assert parse_action("```bash\nsubmit\n```") == ("submit", "")
    assert parse_action("```\nsend_message I edit slugify only\n```") == ("message", "I edit slugify only")
    assert parse_action("```bash\nsend_message <<'MSG'\nline one\nline two\nMSG\n```") == ("message",
                                                                                           "line one\nline two")
    assert parse_action("no command here") is None and parse_action("```bash\n\n```") is None


def heredoc(cmd_prefix: str, body: str) -> str:
    return f"```bash\n{cmd_prefix} <<'SCOPE_EOF'\n{body}SCOPE_EOF\n```"


def play(env, scripts: dict[str, list[str]]):
    """Drive ``env`` with scripted replies per role until it ends; return the rewards."""
    it = {r: iter(s) for r, s in scripts.items()}
    while True:
        roles = env.next_roles()  # both coders act in a round, as the rollout engine runs them
        if not roles:
            break
        for role in roles:
            env.on_reply(role, next(it[role], "```bash\nsubmit\n```"))
    return env.rewards()


def make_env(pair_id: str, **options):
    cls = get_env("coop_coding")
    task = next(p for p in cls.load_tasks("train") + cls.load_tasks("test") if p.id == pair_id)
    return cls(task, random.Random(0), **options)


@needs_bwrap
def test_scripted_agents_that_coordinate_succeed():
    env = make_env("textkit_task/task1/feature1-feature2")
    fa, fb = env.features["agent"], env.features["partner"]
    scripts = {
        "agent": ["```bash\nsend_message I add truncate at the end of textkit.py; I do not touch slugify.\n```",
                  "```bash\ncat textkit.py\n```",
                  heredoc("git apply", fa["reference_patch"]),
                  "```bash\npython -c 'import textkit; print(textkit.truncate(\"hello world\", 8))'\n```",
                  "```bash\nsubmit\n```"],
        "partner": ["Let me think first.",  # no command: a reminder, and the turn counts
                    heredoc("git apply", fb["reference_patch"]),
                    "```bash\nsubmit\n```"]}
    rewards = play(env, scripts)
    assert rewards == {"agent": 1.0, "partner": 1.0}
    v = env.views
    assert any("[Message from agent1]: I add truncate" in m["content"] for m in v["partner"] if m["role"] == "user")
    assert any("hello..." in m["content"] for m in v["agent"] if m["role"] == "user")
    assert any("no command" in m["content"] for m in v["partner"] if m["role"] == "user")
    meta = env.meta["coop"]
    assert meta["success"] and meta["merge"] == "clean" and meta["messages"] == {"agent1": 1, "agent2": 0}
    assert meta["turns_to_submit"] == {"agent1": 5, "agent2": 3} and meta["malformed"]["agent2"] == 1
    assert env.end_reason == "submitted" and not os.path.exists(env.work)


@needs_bwrap
def test_a_missing_feature_fails_the_pair_and_partial_credit_and_shaping_are_options():
    pair = "stats_task/task1/feature1-feature2"
    env = make_env(pair)
    good = heredoc("git apply", env.features["agent"]["reference_patch"])
    assert play(env, {"agent": [good], "partner": []}) == {"agent": 0.0, "partner": 0.0}
    env = make_env(pair, partial_credit=0.5, shaping_clean_merge=0.1)
    rewards = play(env, {"agent": [good], "partner": []})
    assert rewards == {"agent": pytest.approx(0.6), "partner": pytest.approx(0.1)}


@needs_bwrap
def test_max_turns_submits_what_stands():
    env = make_env("settings_task/task1/feature1-feature3", max_turns=2)
    rewards = play(env, {"agent": ["```bash\nls\n```"] * 5, "partner": ["```bash\nls\n```"] * 5})
    assert rewards == {"agent": 0.0, "partner": 0.0} and env.turns == {"agent": 2, "partner": 2}


def test_options_are_declared_and_a_missing_data_dir_is_named():
    names = CoopCoding.option_names()
    assert {"max_turns", "partial_credit", "shaping_tests", "data_dir", "allow_unsandboxed"} <= names
    with pytest.raises(FileNotFoundError, match="not a directory"):
        CoopCoding.load_tasks("train", data_dir="/nonexistent/coop")


@needs_bwrap
def test_the_tiny_model_through_the_rollout_engine():
    """Token plumbing: two tiny-model coders in the batched rollout engine; each role's trace is its own,
    token-exact, with the mask on its generated tokens only."""
    from scope.models.backend import ModelRef
    from scope.models.loading import load_tokenizer, tiny_backend
    from scope.rollout import Job, run_rollouts
    from scope.types import Episode, SamplingParams

    b = tiny_backend(load_tokenizer("tiny-random"), seed=0)
    b.add_lora("agent")
    refs = {"agent": ModelRef("tiny:agent", b, "agent", True), "partner": ModelRef("tiny:base", b)}
    sp = {r: SamplingParams(temperature=1.0, max_new_tokens=12) for r in refs}
    cls = get_env("coop_coding")
    tasks = cls.load_tasks("test")[:2]
    jobs = [Job(env=cls(t, random.Random(i), max_turns=2), episode=Episode(t.id, str(i), 0), bindings=dict(refs), uid=i)
            for i, t in enumerate(tasks)]
    eps, st = run_rollouts(jobs, sp, max_context=4096, end_on_truncation=False)
    assert st.rounds == 2  # both coders reply in each round: 2 turns each in 2 rounds (taking turns: 4)
    for e in eps:
        assert e.status != "failed", e.error
        assert set(e.rewards) == {"agent", "partner"}
        for role in ("agent", "partner"):
            t = e.traces[role]
            assert t.n_turns == 2 and len(t.token_ids) == len(t.mask) == len(t.logprobs)
            assert 0 < sum(t.mask) <= 24  # its two replies' tokens only
        assert e.meta["coop"]["merge"] in ("clean", "union") and e.meta["coop"]["turns_to_submit"]


@needs_bwrap
@pytest.mark.parametrize("mode", ["frozen", "self_play", "population"])
def test_training_modes_run_on_coop_coding(tmp_path, mode):
    """A frozen teammate, self-play and population self-play through the existing role mechanism: the
    tiny model trains on coop_coding episodes (rewards 0 here; the plumbing is what is tested)."""
    from scope.config import parse_config
    from scope.run import read_metrics
    from scope.train import train

    partner = {"model": "policy", "max_new_tokens": 8}
    steps = 1
    if mode != "frozen":
        partner.update(trainable=True, self_play=True)
    if mode == "population":
        partner.update(source="pool", pool={"size": 2, "every": 1})
        steps = 2
    train(parse_config({
        "run": {"dir": str(tmp_path / "run"), "save_every": 1000, "progress": False},
        "models": {"policy": {"path": "tiny-random", "lora": {"r": 4, "alpha": 8}}},
        "agent": {"model": "policy", "trainable": True, "max_new_tokens": 8},
        "partner": partner,
        "env": {"name": "coop_coding", "train_split": "test", "options": {"max_turns": 2}},
        "rollout": {"n_tasks": 1, "group_size": 2, "end_on_truncation": False},
        "train": {"steps": steps, "lr": 1e-3}}), log=lambda s: None)
    ms = read_metrics(str(tmp_path / "run"))
    assert [m["step"] for m in ms] == list(range(1, steps + 1)) and all(m["failed_episodes"] == 0 for m in ms)
    assert ms[-1]["train/trained_sequences"] == (2 if mode == "frozen" else 4)  # self-play: both roles' traces
    recs = [json.loads(x) for x in open(tmp_path / "run" / "rollouts" / f"step_{steps:06d}.jsonl")]
    assert all(r["meta"]["coop"]["merge"] in ("clean", "union") for r in recs)
    # the step metrics aggregate meta.coop, and scope plot draws them
    m = ms[-1]
    assert m["coop/success_rate"] == sum(r["meta"]["coop"]["success"] for r in recs) / len(recs)
    assert m["coop/merge_clean"] + m["coop/merge_union"] + m["coop/merge_failed"] == pytest.approx(1.0)
    assert m["coop/messages_per_episode"] == sum(sum(r["meta"]["coop"]["messages"].values()) for r in recs) / len(recs)
    assert 1 <= m["coop/turns_to_submit"] <= 2
    if mode == "frozen":
        from scope.plot import plot_runs

        files = plot_runs([str(tmp_path / "run")], str(tmp_path / "plots"))
        assert ({"coop_success.png", "coop_messages.png", "coop_turns_to_submit.png"}
                <= {os.path.basename(f) for f in files})
    if mode == "population":
        assert all(r["models"]["partner"] != r["models"]["agent"] for r in recs)  # a pool member plays
