"""scope sim: the real P4G dialogues as the persuadee saw them, the supervised fit of a simulator on them (loss on
the persuadee's tokens only, cached, resumable), and the fitted adapter played as a frozen partner."""
import json
import os

import pytest
import torch

from conftest import shared_path
from scope.models.loading import load_tokenizer
from scope.data.p4g import persona_text
from scope.sim.fit import FitConfig, encode_dialogue, examples, fit, perplexity


@pytest.fixture(scope="module")
def p4g():
    return shared_path("data", "p4g")


def test_the_split_is_the_environments_and_the_marker_is_the_actual_gift(p4g):
    from scope.envs.base import get_env
    from scope.data.p4g import load_dialogues

    train, test = load_dialogues(p4g, "train"), load_dialogues(p4g, "test")
    assert not {d.user_id for d in train} & {d.user_id for d in test}
    env_test = get_env("p4g").load_tasks("test", personas="real", data_dir=p4g)
    assert {d.user_id for d in test} == {t.data["user_id"] for t in env_test}
    d = next(x for x in train if x.donation and x.donation > 0)
    from scope.envs.p4g import PARTNER_PROMPT, fit_views

    [view] = fit_views(d)  # the default examples: the P4G environment's persuadee view, the persona in its prompt
    assert view[0]["content"] == PARTNER_PROMPT.format(persona=persona_text(d.persona))
    assert [m["role"] for m in view[:3]] == ["system", "user", "assistant"]
    assert view[-1]["role"] == "assistant" and view[-1]["content"].endswith(f"[DONATE ${d.donation:g}]")
    from scope.envs.p4g import parse_donation

    assert parse_donation(view[-1]["content"]) == pytest.approx(d.donation)


def test_the_loss_falls_on_the_persuadees_tokens_only(p4g):
    from scope.data.p4g import load_dialogues

    tok = load_tokenizer("tiny-random")
    d = load_dialogues(p4g, "train")[0]
    view = d.partner_view("You are a persuadee.")[:5]  # system, two exchanges
    ids, mask = encode_dialogue(tok, view)
    assert ids == tok(tok.apply_chat_template(view, tokenize=False), add_special_tokens=False)["input_ids"]
    said = tok.decode([t for t, m in zip(ids, mask) if m])
    assert said == "".join(m["content"] + "<|im_end|>" for m in view if m["role"] == "assistant")


def small_cfg(p4g, out, **kw):
    return FitConfig(model="tiny-random", data_dir=p4g, out=str(out), **{
        "max_dialogues": 6, "max_tokens": 768, "batch_tokens": 1536, "lr": 1e-2, "epochs": 2.0, "warmup_steps": 2,
        **kw})


def test_a_small_fit_lowers_held_out_perplexity_and_is_cached(p4g, tmp_path):
    from scope.models.loading import load_backend
    from scope.models.loading import load_frozen_adapter
    from scope.models.backend import ModelRef
    from scope.data.p4g import load_dialogues

    cfg = small_cfg(p4g, tmp_path / "fit")
    meta = fit(cfg, log=lambda s: None, progress=False)
    assert meta["finished"] and meta["losses"][-1] < meta["losses"][0]
    b = load_backend("tiny-random")
    ref = load_frozen_adapter(ModelRef("tiny:base", b), str(tmp_path / "fit" / "adapter"), "fitted")
    held = examples(b.tokenizer, load_dialogues(p4g, "test")[:12], 1024)
    assert held
    base, fitted = perplexity(b, None, held, 2048), perplexity(b, ref.adapter, held, 2048)
    assert fitted < base * 0.8, (base, fitted)
    logs = []
    fit(cfg, log=logs.append, progress=False)  # the same data and options: nothing to do
    assert any("already holds this fit" in s for s in logs)


def test_an_interrupted_fit_resumes_to_the_same_adapter(p4g, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from scope.sim import fit as fit_mod

    straight = small_cfg(p4g, tmp_path / "straight", save_every=3, epochs=0.5)
    fit(straight, log=lambda s: None, progress=False)
    cut = small_cfg(p4g, tmp_path / "cut", save_every=3, epochs=0.5)
    real_bar = fit_mod._bar

    def breaking_bar(total, start, on):
        upd = real_bar(total, start, on)

        def update(step, loss):
            if step == 5 and start == 0:
                raise KeyboardInterrupt("killed at step 5")
            return upd(step, loss)
        return update

    monkeypatch.setattr(fit_mod, "_bar", breaking_bar)
    with pytest.raises(KeyboardInterrupt):
        fit(cut, log=lambda s: None, progress=False)
    assert os.path.exists(tmp_path / "cut" / "checkpoint" / "state.pt")
    logs = []
    fit(cut, log=logs.append, progress=False)
    assert any("resumed at step 3" in s for s in logs)
    a = load_file(str(next((tmp_path / "straight" / "adapter").rglob("*.safetensors"))))
    b = load_file(str(next((tmp_path / "cut" / "adapter").rglob("*.safetensors"))))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert json.load(open(tmp_path / "cut" / "fit.json"))["losses"] == \
        pytest.approx(json.load(open(tmp_path / "straight" / "fit.json"))["losses"], abs=1e-5)


def test_a_models_entry_with_an_adapter_plays_it_on_the_shared_base(p4g, tmp_path):
    """models.<m>.adapter: the frozen partner plays the fitted adapter, on the same base as the agent's."""
    from scope.config import parse_config
    from scope.setup import build_models

    fit(small_cfg(p4g, tmp_path / "fit", epochs=1.0), log=lambda s: None, progress=False)
    cfg = parse_config({"models": {"policy": {"path": "tiny-random"},
                                   "people": {"path": "tiny-random", "adapter": str(tmp_path / "fit" / "adapter")}},
                        "agent": {"model": "policy", "trainable": True}, "partner": {"model": "people"},
                        "env": {"name": "p4g", "options": {"max_turns": 1}}})
    backends, sources, trainable = build_models(cfg)
    assert len(backends) == 1  # one base in memory: the agent's adapter and the fitted one on it
    b = sources["partner"].assign(None, 0, 0)
    assert b.ref.adapter == "frozen_people" and b.ref.backend is trainable["agent"].backend
    assert set(b.ref.backend.adapter_names()) == {"agent", "frozen_people"}
    assert not any(p.requires_grad for n, p in b.ref.backend.model.named_parameters() if ".frozen_people." in n)


def shouted(d):
    """A views function of this test (``--examples tests.test_sim:shouted`` style): one view, its own prompt."""
    return [d.partner_view("YOU ARE A PERSUADEE.", marker=False)]


def test_the_fit_examples_come_from_an_import_path(p4g, tmp_path):
    """``examples`` names the function that turns each real dialogue into the views to fit on: another prompt
    reaches the examples, and a path that does not load is a one-line error before any model is loaded."""
    from scope.data.p4g import load_dialogues
    from scope.sim.fit import load_views

    tok = load_tokenizer("tiny-random")
    ds = load_dialogues(p4g, "train")[:3]
    mine = examples(tok, ds, 768, load_views("test_sim:shouted"))
    default = examples(tok, ds, 768)
    assert mine and default and mine != default
    assert all("YOU ARE A PERSUADEE." in tok.decode(ids) and "[DONATE" not in tok.decode(ids) for ids, _ in mine)
    with pytest.raises(ValueError, match="examples 'nowhere.at_all:views' cannot be loaded"):
        fit(small_cfg(p4g, tmp_path / "bad", examples="nowhere.at_all:views"), log=lambda s: None, progress=False)
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="is not a function"):
        load_views("scope.envs.p4g:PARTNER_PROMPT")
