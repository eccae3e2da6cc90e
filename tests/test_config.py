import os
import subprocess
import sys

import pytest

from scope.config import ConfigError, parse_config

from scope.configfile import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_defaults_follow_the_paper():
    c = parse_config({})
    assert (c.rollout.n_tasks, c.rollout.group_size) == (16, 8)
    assert c.agent.temperature == 0.7 and c.train.kl_coef == 0.005 and c.train.lr == 1e-6
    assert c.env.options.get("max_turns", 10) == 10
    assert (c.train.eps_low, c.train.eps_high, c.train.grad_clip) == (0.2, 0.28, 1.0)
    assert c.train.betas == (0.9, 0.98) and c.train.weight_decay == 0.1
    assert c.train.steps == 250


def test_shipped_configs_and_panels_are_valid_and_match_the_paper():
    import glob
    import os

    from scope.eval import load_panel

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfgs = {os.path.basename(f): load_config(f) for f in glob.glob(os.path.join(root, "configs", "*.yaml"))}
    assert len(cfgs) >= 10
    for name, c in cfgs.items():
        if name.startswith("p4g_"):  # the paper's persuadees (the real P4G participants), and the release's turns
            assert c.env.options["personas"] == "real", name
            assert c.env.options["max_turns"] == 5 and c.env.options["continue_after_zero"] is True, name
        if name.startswith("tau2_"):
            assert c.env.options["max_steps"] == 30, name
        if c.partner.source == "rotation":  # the paper rotates across a task's rollouts
            assert c.partner.group_shared is False, name
        if c.partner.trainable and not c.partner.self_play:  # the paper's simulator rewards
            assert c.partner.reward == ("adversarial" if c.env.name == "p4g" else "curriculum"), name
    for f in glob.glob(os.path.join(root, "configs", "panels", "*.yaml")):
        panel = load_panel(f)
        if os.path.basename(f) in ("p4g.yaml", "tau2.yaml"):  # the paper's six (three seen), and another family
            assert [p.seen for p in panel.partners].count(True) == 3 and len(panel.partners) == 7, f
            assert [panel.models[p.model].path for p in panel.partners if p.model in panel.models] == ["gemma3-270m"]
            assert all(p.decoding == "plain" for p in panel.partners if not p.seen)  # VS is a training paradigm
            assert panel.episodes is None  # every test task
        if name.startswith(("p4g_", "tau2_")):  # the paper's held-out evaluation runs by default
            assert c.eval.panel and os.path.exists(os.path.join(root, c.eval.panel)), name
    for env, ens in (("p4g", "p4g_ensemble.yaml"), ("tau2", "tau2_retail_ensemble.yaml")):
        # the seen simulators of a panel are the ones an ensemble trains against (single: the first)
        seen = [p for p in load_panel(os.path.join(root, "configs", "panels", f"{env}.yaml")).partners if p.seen]
        assert [s.spec_id() for s in cfgs[ens].partner.rotation] == [p.spec_id() for p in seen], ens
        single = cfgs["p4g_single.yaml" if env == "p4g" else "tau2_retail.yaml"].partner
        assert (single.temperature, single.note) == (seen[0].temperature, seen[0].note), env


@pytest.mark.parametrize("data,needle", [
    ({"train": {"lrr": 1}}, "train.lrr: unknown key"),
    ({"bogus": 1}, "bogus: unknown key"),
    ({"rollout": {"group_size": 0}}, "rollout.group_size"),
    ({"agent": {"temperature": "hot"}}, "agent.temperature"),
    ({"agent": {"model": "nope"}}, "agent.model: 'nope' is not one of models"),
    ({"env": {"name": "chess"}}, "unknown environment 'chess'"),
    ({"models": {"policy": {"finetune": "qlora"}}}, "models.policy.finetune"),
    ({"train": {"eps_low": 1.5}}, "train.eps_low"),
    ({"train": {"eps_high": 0}}, "train.eps_high"),
    ({"train": {"kl_coef": float("inf")}}, "train.kl_coef"),
    ({"train": {"lr": float("nan")}}, "train.lr"),
    ({"models": {"policy": {"finetune": "full"}}, "agent": {"trainable": True}, "partner": {"trainable": True}},
     "give the partner its own models entry"),
    ({"models": {"policy": {"backend": "vllm", "finetune": "full", "vllm": {"base_url": "http://127.0.0.1:1"}}},
      "agent": {"trainable": True}}, "a frozen role cannot sample from it there"),
])
def test_bad_config_names_the_key(data, needle):
    with pytest.raises(ConfigError) as e:
        parse_config(data)
    assert needle in str(e.value)


def test_yaml_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  steps: 3\n")
    c = load_config(str(p), ["train.lr=0.5", "rollout.group_size=2"])
    assert (c.train.steps, c.train.lr, c.rollout.group_size) == (3, 0.5, 2)


def test_shipped_configs_validate():
    import glob
    import os

    root = os.path.dirname(os.path.dirname(__file__))
    files = glob.glob(os.path.join(root, "configs", "*.yaml"))
    assert files
    for f in files:
        load_config(f)
    recipe = load_config(os.path.join(root, "configs", "scale", "qwen3_4b_8gpu.yaml"))  # the 8-GPU recipe
    m = recipe.models["policy"]
    assert (m.backend, m.device, recipe.rollout.n_tasks, recipe.rollout.group_size) == ("vllm", "cuda:0", 16, 8)
    assert "0" not in m.vllm.env["CUDA_VISIBLE_DEVICES"].split(",")  # the engine stays off the learner's GPU
    from scope.eval import load_panel

    panels = glob.glob(os.path.join(root, "configs", "panels", "*.yaml"))
    assert panels
    for f in panels:
        load_panel(f)


def test_cli_reports_bad_key(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  stepz: 3\n")
    r = subprocess.run([sys.executable, "-m", "scope.cli", "train", "--config", str(p)], capture_output=True,
                       text=True)
    assert r.returncode == 2
    assert "train.stepz: unknown key" in r.stderr


@pytest.mark.parametrize("env,option,value", [
    ("p4g", "max_turns", "abc"), ("tau2_retail", "max_steps", "ten"), ("tau2_airline", "agent_stop", "maybe"),
    ("coop_coding", "workspace_mb", "1.5")])
def test_a_wrong_typed_env_option_is_one_error_line_before_anything_is_written(tmp_path, env, option, value):
    """Environment options are checked against their declared types at start-up: exit 2, one line naming
    the key, and no run directory (not a TypeError three steps into the run)."""
    run_dir = tmp_path / "run"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"run: {{dir: {run_dir}}}\nmodels: {{policy: {{path: tiny-random}}}}\nenv: {{name: {env}}}\n"
                   "train: {steps: 1}\n")
    r = subprocess.run([sys.executable, "-m", "scope.cli", "train", "--config", str(cfg),
                        "--set", f"env.options.{option}={value}"], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr[-2000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and f"env.options.{option}" in errors[0], errors
    assert not run_dir.exists()
    good = parse_config({"env": {"name": env, "options": {option: {"max_turns": "4", "max_steps": "7",
                         "agent_stop": "false", "workspace_mb": "64", "discount": "0.5"}[option]}}})
    assert not isinstance(good.env.options[option], str)  # the value, converted to its declared type


def test_cli_errors_are_one_line_and_a_closed_pipe_ends_quietly(tmp_path):
    """A missing option is one ``error:`` line with exit 2 (no traceback); ``scope check-config ... | head``
    whose reader has gone ends without a BrokenPipeError traceback."""
    r = subprocess.run([sys.executable, "-m", "scope.cli", "train"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip() == "error: give --config FILE or --resume RUN_DIR"
    p = subprocess.Popen([sys.executable, "-m", "scope.cli", "check-config", "configs/p4g_cotrain.yaml"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    p.stdout.close()  # the reader leaves before the config is printed (the interpreter takes ~1 s to start)
    err = p.stderr.read().decode()
    assert p.wait() == 1 and "Traceback" not in err and "BrokenPipe" not in err, err
