"""Evolved persona generators: features, fitness measures on constructed cases and on the P4G data,
task-integrity gates, the genome and its operators, and the search loop on the tiny model."""
import json
import os
import random

import numpy as np
import pytest

from conftest import shared_path
from scope.personas.features import FEATURES, fingerprint, load_p4g_humans, turn_features
from scope.personas.fitness import (HumanLikeness, Standardizer, auc, density_coverage, p4g_integrity,
                                    tau2_integrity, tau2_required_facts)
from scope.personas.genome import LIBRARY, Axis, Genome, check, mutate_structure, seed_genomes


def feat(text):
    return dict(zip(FEATURES, turn_features(text)))


def test_turn_features_on_constructed_turns():
    f = feat("lol yeah I guess, my kids keep me busy. what does the charity actually do?")
    assert f["question"] == 1 and f["clarify"] == 1 and f["informal"] == 1 and f["disclose"] == 1
    assert f["agree"] == 1 and f["pushback"] == 0
    g = feat("No. I don't trust charities, it's a scam.")
    assert g["pushback"] == 1 and g["question"] == 0 and g["informal"] == 0
    assert feat("Sure! [DONATE $2]")["money"] == 0  # the marker is not a word the person wrote
    assert feat("one two three")["words"] < feat(" ".join(["w"] * 40))["words"] <= 1
    assert np.allclose(fingerprint(["Yes.", "No."]), (turn_features("Yes.") + turn_features("No.")) / 2)


def test_auc_and_classifier():
    assert auc([0.9, 0.8], [0.1, 0.2]) == 1.0 and auc([0.1], [0.9]) == 0.0
    assert auc([0.5, 0.5], [0.5, 0.5]) == 0.5 and auc([0.9, 0.8], [0.1, 0.85]) == 0.75
    rng = np.random.default_rng(0)
    h, s = rng.normal(1, 1, (300, 3)), rng.normal(-1, 1, (300, 3))
    c = HumanLikeness().fit(h[:200], s[:200])
    a = auc(c.prob(h[200:]), c.prob(s[200:]))
    assert 0.95 < a <= 1.0  # separable by ~3.5 sd along the diagonal
    c2 = HumanLikeness.from_state(json.loads(json.dumps(c.state())))
    assert np.allclose(c2.prob(h[:5]), c.prob(h[:5]))


def test_density_coverage_rewards_spread():
    rng = np.random.default_rng(1)
    real = rng.normal(0, 1, (400, 2))
    same = rng.normal(0, 1, (100, 2))
    huddled = rng.normal(0, 0.05, (100, 2))
    far = rng.normal(6, 1, (100, 2))
    c_same = density_coverage(real, same)["coverage"]
    c_hud = density_coverage(real, huddled)["coverage"]
    assert c_same > 0.6 > 0.2 > c_hud and density_coverage(real, far)["coverage"] == 0.0
    assert density_coverage(real, same)["density"] == pytest.approx(1.0, abs=0.25)  # same law: about 1
    assert density_coverage(real, far)["density"] == 0.0  # fidelity: nothing where no human is
    assert density_coverage(real, real)["coverage"] == 1.0


def test_on_p4g_a_population_huddled_at_the_human_mean_scores_below_real_held_out_humans():
    h = load_p4g_humans(shared_path("data", "p4g"))
    test = [d[:3] for d in h["test"]]
    rng = random.Random(0)
    rng.shuffle(test)
    sample, reference = test[:40], test[40:]
    ref_fp = np.array([fingerprint(d) for d in reference])
    scale = Standardizer(ref_fp)
    humans = density_coverage(scale(ref_fp), scale(np.array([fingerprint(d) for d in sample])))["coverage"]
    train_fp = np.array([fingerprint(d[:3]) for d in h["train"]])
    mean = train_fp.mean(0)
    near = train_fp[np.argsort(np.linalg.norm((train_fp - mean) / train_fp.std(0), axis=1))[:40]]  # 40 most typical
    huddled = density_coverage(scale(ref_fp), scale(near))["coverage"]
    assert humans > huddled + 0.1, (humans, huddled)
    assert len(h["train"]) > 700 and len(h["test"]) > 150


def test_p4g_integrity_gate():
    assert p4g_integrity(["Hi!", "Sounds good, here you go [DONATE $1.50]"]) is None
    assert p4g_integrity(["I will donate $1 to them."]).startswith("states a donation without the marker")
    assert p4g_integrity(["I'll give two dollars"]).startswith("states a donation without the marker")
    assert p4g_integrity(["Would you like to donate to Save the Children?"]).startswith("plays the persuader")
    assert p4g_integrity(["I am a volunteer for a charity."]).startswith("plays the persuader")
    assert p4g_integrity(["I don't know much about them. I gave $5 to a food bank once."]) is None  # no pledge


TAU2_TASK = {"user_scenario": {"instructions": {"known_info": "You are Yusuf Rossi in zip code 19122.",
                                                "reason_for_call": "Return order #W2378156."}},
             "evaluation_criteria": {"actions": [
                 {"name": "find_user_id_by_name_zip", "arguments": {"first_name": "Yusuf", "last_name": "Rossi",
                                                                     "zip": "19122"}},
                 {"name": "return_delivered_order_items",
                  "arguments": {"order_id": "#W2378156", "item_ids": ["123"], "payment_method_id": "x"}}]}}


def test_tau2_integrity_gate():
    assert tau2_required_facts(TAU2_TASK) == {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122",
                                              "order_id": "#W2378156"}
    good = [{"role": "agent", "content": "Hi! How can I help?"}, {"role": "partner", "content": "I want a return."},
            {"role": "agent", "content": "Your first and last name and zip code, please? And the order id?"},
            {"role": "partner", "content": "Yusuf Rossi, 19122, order W2378156."}]
    assert tau2_integrity(good, TAU2_TASK) is None
    withheld = good[:3] + [{"role": "partner", "content": "Yusuf Rossi, 19122. I'd rather not say the order."}]
    assert tau2_integrity(withheld, TAU2_TASK).startswith("withheld order_id")
    never_asked = [{"role": "agent", "content": "Hello"}, {"role": "partner", "content": "Hi"}]
    assert tau2_integrity(never_asked, TAU2_TASK) is None


def test_genome_expand_check_and_operators():
    g = Genome(axes=[Axis("a", "d", "ON-A.", "OFF-A.", 1.0), Axis("b", "d", "ON-B.", "", 0.0)])
    ps = g.expand(3, random.Random(0))
    assert all(p["text"] == "You are an ordinary adult who just finished a short paid task online. ON-A. "
               "Stay in character." for p in ps)
    assert ps[0]["axes"] == {"a": True, "b": False} and ps[0]["id"].startswith(g.id)
    assert Genome.from_dict(json.loads(json.dumps(g.to_dict()))).id == g.id
    for bad, msg in ((Genome(axes=[]), "at least one axis"), (Genome(axes=g.axes, roleplay="{population}"), "{traits}"),
                     (Genome(axes=[Axis("a", "d", "x", p_on=2)]), "p_on"),
                     (Genome(axes=[Axis("a", "d", "x" * 500)]), "longer than")):
        with pytest.raises(ValueError, match=msg):
            check(bad)
    rng = random.Random(3)
    seeds = seed_genomes(6, rng)
    ops = set()
    for i in range(60):
        c = mutate_structure(seeds[i % 6], rng, seeds[(i + 1) % 6])
        check(c)
        ops.update(c.ops)
        assert c.parents[0] == seeds[i % 6].id
    assert ops == {"p_on", "add", "drop", "swap", "crossover"}
    assert {a.name for a in LIBRARY} >= {a.name for s in seeds for a in s.axes}


def test_model_mutator_puts_text_only_and_refuses_bad_replies():
    from scope.partners.binding import Binding
    from scope.personas.mutate import ModelMutator, clean_reply
    from scope.study.agents import ScriptedRef
    from scope.types import SamplingParams

    assert clean_reply('New instruction: "You talk about your garden a lot."') == "You talk about your garden a lot."
    assert clean_reply("ok") is None and clean_reply("Write [DONATE $2] now please") is None
    assert clean_reply('{"name": "x"} and more text here') is None
    ref = ScriptedRef("m", ["You speak slowly and think aloud before you answer."])
    m = ModelMutator(Binding(id="m", ref=ref, sampling=SamplingParams()), rewrite_prob=1.0)
    rng = random.Random(0)
    seeds = seed_genomes(4, rng)
    kids = m([(s, None) for s in seeds], rng)
    assert m.stats["rewrites"] == 4 and all(any(o.startswith("rewrite:") for o in k.ops) for k in kids)
    texts = [t for k in kids for t in [k.population] + [x for a in k.axes for x in (a.on, a.off)]]
    assert texts.count("You speak slowly and think aloud before you answer.") == 4
    bad = ModelMutator(Binding(id="m", ref=ScriptedRef("m", ["<tool_call>{}"]), sampling=SamplingParams()), 1.0)
    kids = bad([(s, None) for s in seeds], rng)
    assert bad.stats["refused"] == 4 and bad.stats["rewrites"] == 0 and all(len(k.ops) == 1 for k in kids)


def search_cfg(tmp_path, **search):
    from scope.personas.config import PersonaSearchConfig

    return PersonaSearchConfig.model_validate({
        "run": {"dir": str(tmp_path / "ps"), "seed": 0},
        "models": {"policy": {"path": "tiny-random"}},
        "agent": {"model": "policy", "max_new_tokens": 8}, "simulator": {"model": "policy", "max_new_tokens": 8},
        "mutator": {"model": "policy", "max_new_tokens": 8}, "expander": {"model": "policy", "max_new_tokens": 8},
        "env": {"name": "p4g", "options": {"max_turns": 2, "personas": "builtin"}},
        "humans": {"data_dir": shared_path("data", "p4g")},
        "search": {"generations": 1, "seeds": 2, "children": 2, "population": 3, "calibration_dialogues": 6,
                   "bins": 2, "max_reject": 1.0, **search}})


def test_search_loop_on_the_tiny_model_checkpoints_resumes_and_writes_a_persona_file(tmp_path):
    from scope.partners.sources import load_personas
    from scope.personas.search import evolve

    cfg = search_cfg(tmp_path)
    lines = []
    state = evolve(cfg, log=lines.append)
    d = cfg.run_dir
    assert [h["generation"] for h in state["history"]] == [0, 1]
    assert any("held-out AUC" in ln for ln in lines)
    assert any(ln.startswith("generation 1/1") and "eta" in ln for ln in lines)
    assert state["archive"] and all(0 <= e["metrics"]["coverage"] <= 1 for e in state["archive"].values())
    out = json.load(open(os.path.join(d, "personas.json")))
    assert out["generator"]["axes"] and set(out["fitness"]) >= {"human", "coverage", "fitness"}
    personas = load_personas(os.path.join(d, "personas.json"))  # what partner.source: persona reads
    assert personas and all(p["id"] and p["text"] for p in personas)
    with pytest.raises(Exception, match="--resume"):
        evolve(cfg, log=lines.append)
    cfg.search.generations = 2
    state2 = evolve(cfg, resume=True, log=lines.append)
    assert [h["generation"] for h in state2["history"]] == [0, 1, 2]
    assert any(ln.startswith("resuming") for ln in lines)
    assert state2["classifier"] == state["classifier"]  # trained once, kept


def test_scope_eval_puts_evolved_persona_simulators_on_a_panel(tmp_path):
    from scope.config import EnvConfig
    from scope.eval import Panel, panel_jobs
    from scope.partners.binding import Binding
    from scope.types import SamplingParams

    f = tmp_path / "personas.json"
    f.write_text(json.dumps({"personas": [{"id": "p1", "text": "PERSONA-ONE"}, {"id": "p2", "text": "PERSONA-TWO"}],
                             "generator": {}, "fitness": {}}))
    panel = Panel.model_validate({"partners": [{"model": "m", "id": "evolved", "personas": str(f)}], "episodes": 4})
    agent = Binding(id="a", ref=object(), sampling=SamplingParams())
    env = EnvConfig(name="p4g", options={"personas": "builtin"})
    jobs, _ = panel_jobs(agent, panel, {"m": object()}, env, "test", 0)
    notes = [j.bindings["partner"].note for j in jobs]
    assert notes == ["PERSONA-ONE", "PERSONA-TWO", "PERSONA-ONE", "PERSONA-TWO"]
    assert [j.episode.meta["sim_persona"] for j in jobs] == ["p1", "p2", "p1", "p2"]


def test_shipped_persona_and_study_configs_validate():
    import glob

    from scope.personas.config import load_search_config
    from scope.study.config import load_study

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = load_search_config(os.path.join(root, "configs", "personas", "evolve.yaml"))
    assert cfg.env["name"] == "p4g" and cfg.mutator is not None
    studies = {os.path.basename(f): load_study(f) for f in glob.glob(os.path.join(root, "configs", "study", "*.yaml"))}
    assert set(studies) >= {"demo.yaml", "paper.yaml"}
    paper = studies["paper.yaml"]
    assert list(paper.conditions) == ["base", "rl_single", "vs", "cotrain"] and set(paper.tasks) == {"tau2", "p4g"}
    assert paper.tasks["tau2"].turn_cap() == 30 and paper.tasks["p4g"].turn_cap() == 10


def test_role_play_expansion_through_a_model():
    from scope.partners.binding import Binding
    from scope.personas.mutate import expand_with_model
    from scope.study.agents import ScriptedRef
    from scope.types import SamplingParams

    g = seed_genomes(1, random.Random(0))[0]
    pop = g.expand(3, random.Random(1))
    ok = Binding(id="e", ref=ScriptedRef("e", ["You are Dana, a nurse who counts every dollar."]),
                 sampling=SamplingParams())
    stats = {}
    out = expand_with_model(pop, ok, stats)
    assert [p["text"] for p in out] == ["You are Dana, a nurse who counts every dollar."] * 3
    assert [p["template_text"] for p in out] == [p["text"] for p in pop] and stats == {"expanded": 3}
    bad = Binding(id="e", ref=ScriptedRef("e", ["{}"]), sampling=SamplingParams())
    stats = {}
    out = expand_with_model(pop, bad, stats)
    assert [p["text"] for p in out] == [p["text"] for p in pop] and stats == {"expand_refused": 3}


# ---- generator programs (run in the sandbox) -------------------------------------------------------------
def test_a_generator_program_runs_in_the_sandbox_and_its_output_is_checked():
    from scope.personas.genome import seed_genomes
    from scope.personas.program import ProgramFailure, ProgramGenome, mutate_program, run_program

    g = ProgramGenome.from_genome(seed_genomes(1, random.Random(0))[0])
    pop = g.expand(5, random.Random(1), tasks=[{"name": "A"}, {"name": "B"}])
    assert len(pop) == 5 and all(p["text"] and p["id"].startswith(g.id) for p in pop)
    child = mutate_program(g, random.Random(2))
    assert child.id != g.id and child.parents == [g.id]
    task_aware = "DATA = {}\ndef generate(task, rng):\n    return {'text': 'You are ' + task['name'] + '.'}\n"
    assert [p["text"] for p in run_program(task_aware, [{"task": {"name": "Ann"}, "seed": 0}])] == ["You are Ann."]
    for bad, why in (("def generate(task, rng):\n    return {'text': ''}\n", "without text"),
                     ("def generate(task, rng):\n    return {'text': 'x' * 5000}\n", "over"),
                     ("print('hello')\n", "AttributeError")):
        with pytest.raises(ProgramFailure, match=why):
            run_program(bad, [{"task": {}, "seed": 0}])


LOOPING = "DATA = {}\ndef generate(task, rng):\n    while True:\n        pass\n"
CRASHING = "DATA = {}\ndef generate(task, rng):\n    return {'text': 1 / 0}\n"
ESCAPING = ("import os, socket\nDATA = {}\ndef generate(task, rng):\n"
            "    open(os.path.expanduser('~') + '/../../tmp/scope-escaped-{marker}', 'w').write('x')\n"
            "    socket.create_connection(('127.0.0.1', 22), timeout=1)\n    return {'text': 'escaped'}\n")


def test_looping_crashing_and_escaping_programs_score_zero_and_the_search_goes_on(tmp_path, monkeypatch):
    from scope.personas import search as search_mod
    from scope.personas.program import ProgramGenome
    from scope.personas.search import evolve

    marker = f"/tmp/scope-escaped-{os.getpid()}"
    bad = [ProgramGenome(LOOPING), ProgramGenome(CRASHING),
           ProgramGenome(ESCAPING.replace("{marker}", str(os.getpid())))]
    real_seed = search_mod.seed_children

    def seeds(n, kind, rng, env_name="p4g"):  # the search starts from the bad programs beside good ones
        return bad + real_seed(n, kind, rng, env_name)
    monkeypatch.setattr(search_mod, "seed_children", seeds)
    cfg = search_cfg(tmp_path, genome="both", seeds=2)
    lines = []
    state = evolve(cfg, log=lines.append)
    fails = {f["id"]: f["reason"] for f in state["program_failures"]}
    assert {g.id for g in bad} <= set(fails)
    assert "CPU time" in fails[bad[0].id] or "timed out" in fails[bad[0].id]
    assert "ZeroDivisionError" in fails[bad[1].id] and "Error" in fails[bad[2].id]
    assert not os.path.exists(marker)  # nothing of it reached the host
    assert state["archive"] and not ({e["genome"].get("id") for e in state["archive"].values()} & set(fails))
    assert [h["generation"] for h in state["history"]] == [0, 1]  # and the search went on
    assert state["history"][0]["program_failures"] == 3


@pytest.mark.long
def test_the_search_runs_on_tau2_retail_with_its_integrity_gate(tmp_path):
    from scope.personas.config import PersonaSearchConfig
    from scope.personas.search import evolve

    cfg = PersonaSearchConfig.model_validate({
        "run": {"dir": str(tmp_path / "ps"), "seed": 0}, "models": {"policy": {"path": "tiny-random"}},
        "agent": {"model": "policy", "max_new_tokens": 6}, "simulator": {"model": "policy", "max_new_tokens": 6},
        "mutator": None,
        "env": {"name": "tau2_retail", "options": {"data_dir": shared_path("data", "tau2"), "max_steps": 4}},
        "humans": {"data_dir": shared_path("data", "p4g")}, "max_context": 16384,
        "search": {"generations": 1, "seeds": 2, "children": 2, "population": 2, "calibration_dialogues": 4,
                   "bins": 2, "max_reject": 1.0, "genome": "both"}})
    state = evolve(cfg, log=lambda s: None)
    assert [h["generation"] for h in state["history"]] == [0, 1] and state["archive"]
    from scope.personas.genome import TAU2_POPULATION

    personas = json.load(open(tmp_path / "ps" / "personas.json"))["personas"]
    assert all(p["text"].startswith(TAU2_POPULATION) and "charit" not in p["text"] for p in personas)


def test_tau2_generators_start_and_grow_from_the_customer_library():
    """A tau2 search seeds customers (not P4G persuadees), and a structural 'add' draws from the customers' axes."""
    import random

    from scope.personas.genome import LIBRARY, TAU2_LIBRARY, TAU2_POPULATION, mutate_structure, seed_genomes
    from scope.personas.program import ProgramGenome, data_of, mutate_program

    rng = random.Random(0)
    gs = seed_genomes(6, rng, domain="tau2")
    names = {a.name for a in TAU2_LIBRARY}
    assert all(g.population == TAU2_POPULATION and {a.name for a in g.axes} <= names for g in gs)
    for _ in range(30):
        gs = [mutate_structure(g, rng) for g in gs]
        assert all({a.name for a in g.axes} <= names for g in gs)
    prog = ProgramGenome.from_genome(seed_genomes(1, rng, domain="tau2")[0])
    for _ in range(30):
        prog = mutate_program(prog, rng)
        assert {t[0] for t in data_of(prog.source)["traits"]} <= names
    assert {a.name for a in seed_genomes(4, rng)[0].axes} <= {a.name for a in LIBRARY}  # P4G by default


def test_human_traces_of_your_own(tmp_path):
    from scope.config import ConfigError
    from scope.personas.search import load_traces

    f = tmp_path / "traces.jsonl"
    f.write_text("\n".join(json.dumps({"user_turns": [f"hi {i}", "my order is late"]}) for i in range(40)))
    h = load_traces(str(f))
    assert len(h["train"]) == 32 and len(h["test"]) == 8  # every fifth held out
    f.write_text('{"user_turns": "not a list"}\n')
    with pytest.raises(ConfigError, match="user_turns"):
        load_traces(str(f))


def test_degenerate_rewrites_and_bad_elite_data_are_unusable_and_the_search_goes_on():
    """Model-written programs are parsed on the host: a sum of thousands of terms, thousands of unary minus
    signs and a long attribute chain (which exhaust the parser's stack or memory) are unusable mutations, and
    an elite whose trait name is a list or a dict is refused, not a TypeError in mutation."""
    from scope.personas.program import ProgramGenome, data_of, extract_program, mutate_program
    from scope.personas.search import ProgramMutator

    gen = "def generate(task, rng):\n    return {'text': 'x'}\n"
    for body in ("x = " + "+".join(["1"] * 3900), "x = " + "-" * 7900 + "1", "x = " + "a.b." * 3000 + "c"):
        assert extract_program(f"```python\n{body}\n{gen}```") is None
    for name in (["a", "b"], {"k": 1}):
        src = f"DATA = {{'population': 'p', 'traits': [[{name!r}, 'on', 0.5]]}}\n{gen}"
        assert data_of(src) is None and extract_program(f"```python\n{src}```") is None
        for seed in range(20):
            child = mutate_program(ProgramGenome(src), random.Random(seed))
            assert child.ops == ["none"]
    ok = "DATA = {'population': 'p', 'traits': [['doubtful', 'You doubt.', 0.5]]}\n" + gen
    assert extract_program(f"```python\n{ok}```") == ok

    class Reply:
        def __init__(self, text):
            self.text = text

    replies = iter(["```python\nx = " + "+".join(["1"] * 3900) + "\n" + gen + "```", "```python\n" + ok + "```"])

    class Binding:
        ref, sampling = None, None

    import scope.rollout as rollout

    orig = rollout.chat_complete
    rollout.chat_complete = lambda ref, convs, sampling: [Reply(next(replies)) for _ in convs]
    try:
        m = ProgramMutator(Binding(), rewrite_prob=1.0)
        out = m([(ProgramGenome(ok), None), (ProgramGenome(ok), None)], random.Random(0))
    finally:
        rollout.chat_complete = orig
    assert m.stats["unusable"] == 1 and m.stats["rewrites"] == 1 and len(out) == 2
