"""Partner supply: sources, the openai backend against `scope serve`, faults, Verbalized Sampling."""
import json
import math
import os
import random
import socket
import subprocess
import sys

import pytest

from scope.config import parse_config
from scope.envs.base import get_env
from scope.models.loading import load_tokenizer, tiny_backend
from scope.models.openai_backend import OpenAIRef
from scope.models.server import serve_in_thread
from scope.partners.binding import Binding
from scope.partners.sources import PersonaSource, RotationSource, load_personas
from scope.rollout import Job, run_rollouts
from scope.run import read_metrics
from scope.train import train
from scope.types import Completion, Episode, SamplingParams, Task

from helpers import ScriptedRef

SP = SamplingParams(max_new_tokens=8)


def bindings(k):
    return [Binding(id=f"p{i}", ref=None, sampling=SP) for i in range(k)]


def test_rotation_fixed_cycle_shared_or_spread():
    t = Task("t", "train")
    src = RotationSource(bindings(3), group_shared=True)
    ids = [[src.assign(t, ti, g).id for g in range(4)] for ti in range(4)]
    assert ids == [["p0"] * 4, ["p1"] * 4, ["p2"] * 4, ["p0"] * 4]
    src = RotationSource(bindings(3), group_shared=False)
    ids = [src.assign(t, 0, g).id for g in range(7)]
    assert ids == ["p0", "p1", "p2", "p0", "p1", "p2", "p0"]
    src2 = RotationSource(bindings(3), group_shared=False)
    src2.load_state_dict(src.state_dict())
    assert src2.assign(t, 0, 0).id == src.assign(t, 0, 0).id


def test_persona_source_draws_and_puts_persona_in_prompt():
    pool = load_personas("builtin")
    assert len(pool) >= 10
    src = PersonaSource(Binding("smol", None, SP), pool, seed=0)
    got = [src.assign(Task("t", "train"), 0, g) for g in range(40)]
    assert len({b.id for b in got}) > 5 and all(b.id.startswith("smol/") for b in got)
    b = got[0]
    env_cls = get_env("p4g")
    env = env_cls(env_cls.load_tasks("train")[0], random.Random(0))
    env.add_note("partner", b.note)
    assert env.views["partner"][0]["content"].endswith(b.note)
    with pytest.raises(ValueError, match="list of"):
        bad = os.path.join(os.path.dirname(__file__), "nope.json")
        open(bad, "w").write("{}")
        try:
            load_personas(bad)
        finally:
            os.remove(bad)


def tiny_cfg(run_dir, partner, models=None, steps=2):
    return parse_config({
        "run": {"dir": str(run_dir), "save_every": 1, "progress": False},
        "models": {"policy": {"path": "tiny-random"}, **(models or {})},
        "agent": {"model": "policy", "trainable": True, "max_new_tokens": 10},
        "partner": partner,
        "env": {"name": "p4g", "options": {"max_turns": 2, "force_decision": True}},
        "rollout": {"n_tasks": 3, "group_size": 2, "end_on_truncation": False},
        "train": {"steps": steps, "lr": 1e-3}})


def rollouts(run_dir, step=1):
    return [json.loads(x) for x in open(os.path.join(run_dir, "rollouts", f"step_{step:06d}.jsonl"))]


def test_training_with_rotation_records_each_rollouts_partner(tmp_path):
    partner = {"source": "rotation", "group_shared": False, "rotation": [
        {"id": "a", "model": "policy", "temperature": 0.7, "max_new_tokens": 10},
        {"id": "b", "model": "policy", "temperature": 1.0, "max_new_tokens": 10, "note": "Be terse."},
        {"id": "c", "model": "policy", "temperature": 0.3, "max_new_tokens": 10}]}
    train(tiny_cfg(tmp_path / "r", partner), log=lambda s: None)
    ids = [r["meta"]["partner"] for r in rollouts(tmp_path / "r")]
    assert ids == ["a", "b", "c", "a", "b", "c"]
    # resume continues the cycle where it stopped
    step2 = [r["meta"]["partner"] for r in rollouts(tmp_path / "r", 2)]
    assert step2 == ["a", "b", "c", "a", "b", "c"]


@pytest.fixture(scope="module")
def server():
    b = tiny_backend(load_tokenizer("tiny-random"), seed=1)
    srv, url = serve_in_thread(b)
    yield url
    srv.shutdown()


@pytest.fixture(scope="module")
def flaky_server():
    b = tiny_backend(load_tokenizer("tiny-random"), seed=2)
    srv, url = serve_in_thread(b, fail_rate=0.3, seed=3)
    yield url
    srv.shutdown()


def test_openai_backend_against_scope_serve(server):
    ref = OpenAIRef("srv", base_url=server, model="tiny", api_key_env=None, concurrency=4, max_retries=0)
    convs = [[{"role": "user", "content": f"hello {i}"}] for i in range(6)]
    outs = ref.chat_generate(convs, SamplingParams(temperature=1.0, max_new_tokens=7))
    assert all(isinstance(o, Completion) and o.finish_reason in ("eos", "length") for o in outs)
    assert any(o.text for o in outs)
    import openai

    client = openai.OpenAI(base_url=server, api_key="x")
    assert client.models.list().data[0].id
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages="nope", max_tokens=3)
    # a 400 is not retried: it comes back as this request's error
    bad = ref.chat_generate([[{"role": "user", "content": "x"}]], SamplingParams(max_new_tokens=0))
    assert isinstance(bad[0], Exception) and ref.stats.retries == 0


def test_retries_with_backoff_recover_from_injected_failures(flaky_server):
    ref = OpenAIRef("flaky", base_url=flaky_server, model="tiny", api_key_env=None, concurrency=4, max_retries=6,
                    backoff=0.01)
    outs = ref.chat_generate([[{"role": "user", "content": f"q{i}"}] for i in range(12)], SP)
    assert all(isinstance(o, Completion) for o in outs)
    assert ref.stats.retries > 0 and ref.stats.failures == 0


def test_fault_injection_training_goes_on(tmp_path, flaky_server):
    """An endpoint that fails 30% of requests: steps complete, failures are counted, nothing is NaN."""
    models = {"api": {"backend": "openai", "base_url": flaky_server, "model_name": "tiny", "api_key_env": None,
                      "max_retries": 0, "backoff": 0.0}}
    partner = {"model": "api", "max_new_tokens": 10}
    train(tiny_cfg(tmp_path / "f", partner, models, steps=3), log=lambda s: None)
    ms = read_metrics(str(tmp_path / "f"))
    assert [m["step"] for m in ms] == [1, 2, 3]
    recs = rollouts(tmp_path / "f")
    assert sum(m["failed_episodes"] for m in ms) > 0, ([m["failed_episodes"] for m in ms],
                                                        [(r["status"], r["error"], r["messages"]) for r in recs])
    for m in ms:
        assert all(not (isinstance(v, float) and math.isnan(v)) for v in m.values())
    recs = rollouts(tmp_path / "f")
    failed = [r for r in recs if r["status"] == "failed"]
    assert all("injected failure" in r["error"] or "503" in r["error"] for r in failed), [r["error"] for r in failed]


class ScriptedChat:
    """A chat endpoint stand-in: replies from a list, cycling."""

    chat, json_schema, version = True, True, 0

    def __init__(self, replies, name="chat"):
        self.replies, self.id, self.n, self.formats = replies, name, 0, []

    def drop_sessions(self, keys):
        pass

    def chat_generate(self, convs, sp, response_format=None):
        self.formats.append(response_format)
        out = []
        for _ in convs:
            r = self.replies[self.n % len(self.replies)]
            self.n += 1
            out.append(r if isinstance(r, Exception) else Completion(r, [], [], "eos", model_id=self.id))
        return out


def vs_job(smol_tokenizer, partner_ref, vs_cfg, uid=0):
    from scope.config import VSConfig

    env_cls = get_env("p4g")
    task = env_cls.load_tasks("train")[0]
    agent = ScriptedRef(smol_tokenizer, ["Please donate."], "agent")
    return Job(env=env_cls(task, random.Random(uid), max_turns=1), episode=Episode(task.id, "g", 0),
               bindings={"agent": Binding("agent", agent, SP),
                     "partner": Binding("vs", partner_ref, SP, vs=VSConfig(**vs_cfg))}, uid=uid)


def test_vs_partner_samples_a_candidate_and_records_it(smol_tokenizer):
    good = '```json\n{"responses": [{"text": "Sure [DONATE $2]", "probability": 1.0}, ' \
           '{"text": "No way", "probability": 0.0}]}\n```'
    ref = ScriptedChat([good])
    eps, _ = run_rollouts([vs_job(smol_tokenizer, ref, {"k": 2})])
    e = eps[0]
    assert e.messages[-1] == {"role": "partner", "content": "Sure [DONATE $2]"}
    rec = e.vs[0]
    assert rec["candidates"] == ["Sure [DONATE $2]", "No way"] and rec["index"] == 0 and not rec["fallback"]
    assert rec["attempts"] == 1 and e.rewards["agent"] == 1.0
    assert ref.formats[0]["type"] == "json_schema"


def test_vs_reasks_twice_then_falls_back_to_a_plain_reply(smol_tokenizer):
    ref = ScriptedChat(["not json", "still not", "nope", "Fine, [DONATE $1]"])
    eps, _ = run_rollouts([vs_job(smol_tokenizer, ref, {"k": 5, "max_reasks": 2})])
    rec = eps[0].vs[0]
    assert rec["attempts"] == 3 and rec["fallback"] and rec["index"] is None and len(rec["errors"]) == 3
    assert eps[0].messages[-1]["content"] == "Fine, [DONATE $1]"
    assert ref.formats[-1] is None  # the fallback is a plain request


def test_vs_on_a_local_model(tmp_path):
    partner = {"model": "policy", "decoding": "vs", "vs": {"k": 3, "max_new_tokens": 24}}
    train(tiny_cfg(tmp_path / "v", partner, steps=1), log=lambda s: None)
    recs = rollouts(tmp_path / "v")
    assert all(r["vs"] and r["meta"]["partner"] == "policy+vs" for r in recs)
    vs = [v for r in recs for v in r["vs"]]
    for v in vs:  # a random model rarely closes a text string: most turns fall back to a plain reply
        assert 1 <= v["attempts"] <= 3 and len(v["errors"]) >= v["attempts"] - (0 if v["fallback"] else 1)
        if not v["fallback"]:
            assert v["candidates"] and all(c.strip() for c in v["candidates"]) and v["index"] < len(v["candidates"])
            assert abs(sum(v["probs"]) - 1) < 1e-9
    frac = read_metrics(str(tmp_path / "v"))[0]["vs/fallback_frac"]
    # (a turn that forces a decision gives its first candidate the marker: fewer fallbacks than plain turns)
    assert frac == sum(v["fallback"] for v in vs) / len(vs) and frac > 0.25


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def test_scope_serve_cli():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "scope.cli", "serve", "--model", "tiny-random", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}/v1" in line
        ref = OpenAIRef("cli", base_url=f"http://127.0.0.1:{port}/v1", model="tiny-random", api_key_env=None)
        out = ref.chat_generate([[{"role": "user", "content": "hi"}]], SamplingParams(max_new_tokens=4))
        assert isinstance(out[0], Completion)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_endpoint_requests_use_the_models_token_limit_and_report_truncation():
    """An API partner asks for models.<m>.max_tokens (default 4096, room for a reasoning model), not the
    role's max_new_tokens; a reply cut off there comes back as 'length' (an episode ends truncated)."""
    from types import SimpleNamespace

    from scope.config import ModelConfig

    mc = ModelConfig(backend="openai", base_url="http://127.0.0.1:9/v1", model_name="m", api_key_env=None)
    assert mc.max_tokens == 4096
    ref = OpenAIRef.from_config("api", mc)
    seen = []

    def create(**kw):
        seen.append(kw)
        msg = SimpleNamespace(content="partial")
        return SimpleNamespace(choices=[SimpleNamespace(message=msg, finish_reason="length")])

    ref.client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    out = ref.chat_generate([[{"role": "user", "content": "hi"}]], SamplingParams(max_new_tokens=40))
    assert seen[0]["max_tokens"] == 4096 and out[0].finish_reason == "length"
    ref = OpenAIRef.from_config("api", ModelConfig(backend="openai", base_url="http://127.0.0.1:9/v1", model_name="o",
                                                   api_key_env=None, token_limit_field="max_completion_tokens"))
    ref.client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    ref.chat_generate([[{"role": "user", "content": "hi"}]], SamplingParams(max_new_tokens=40))
    assert seen[1]["max_completion_tokens"] == 4096 and "max_tokens" not in seen[1]  # OpenAI's reasoning models


def _post(url, body):
    """POST with the standard library: bytes (with Content-Length) or an iterator of chunks (chunked)."""
    import http.client
    import urllib.parse

    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    c.request("POST", u.path, body=data, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.status, json.loads(r.read() or b"{}")
    c.close()
    return out


def test_scope_serve_limits_what_a_client_can_ask(server):
    """max_tokens is capped by the room the context leaves; a prompt that fills the context, and a body over
    the size cap (with or without Content-Length), are refused."""
    url = server + "/chat/completions"
    tok = load_tokenizer("tiny-random")  # a character vocabulary with a 4,096-token context

    def n_prompt(text):
        t = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        return len(tok(t, add_special_tokens=False)["input_ids"])

    text = "a" * (4096 - 8 - n_prompt(""))  # leaves room for 8 new tokens
    code, r = _post(url, {"messages": [{"role": "user", "content": text}], "max_tokens": 10 ** 9, "temperature": 1.0})
    assert code == 200, r
    assert r["usage"]["prompt_tokens"] == 4088 and r["usage"]["completion_tokens"] <= 8
    code, r = _post(url, {"messages": [{"role": "user", "content": "a" * 4096}]})
    assert code == 400 and "fills the model's context" in r["error"]["message"]
    assert _post(url, b"x" * (2 << 20))[0] == 413
    assert _post(url, (b"x" * 65536 for _ in range(40)))[0] == 413  # chunked: no Content-Length


def test_scope_serve_answers_400_to_settings_of_the_wrong_kind(server):
    url = server + "/chat/completions"
    msg = [{"role": "user", "content": "hi"}]
    bad = [b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
           b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": Infinity}',
           b'{"messages": [{"role": "user", "content": "hi"}], "top_p": -Infinity}',
           b"[" * 100_000 + b"]" * 100_000]
    for body in bad:
        code, r = _post(url, body)
        assert code == 400, (body[:80], code, r)
    for extra in ({"n": 1.5}, {"n": True}, {"max_tokens": 2.5}, {"max_tokens": "8"}, {"temperature": "hot"},
                  {"stop": [1, 2]}, {"top_p": 0}, {"stop": [f"s{i}" for i in range(90_000)]}, {"stop": ["x" * 257]},
                  {"stop": [""]}):  # 90,000 stop strings once held every other request for 47 s
        code, r = _post(url, {"messages": msg, **extra})
        assert code == 400, (extra, code, r)
    assert _post(url, {"messages": msg, "max_tokens": 2, "n": 1, "temperature": 0})[0] == 200


def test_scope_serve_refuses_a_prompt_too_long_to_fit_before_tokenising():
    """The tiny vocabulary's tokens are single characters (at most 4 bytes), so 900 kB cannot fit 4,096
    tokens: the answer comes without tokenising (the chat template is never applied)."""
    b = tiny_backend(load_tokenizer("tiny-random"), seed=1)
    calls = []
    template = b.tokenizer.apply_chat_template
    b.tokenizer.apply_chat_template = lambda *a, **k: calls.append(1) or template(*a, **k)
    srv, url = serve_in_thread(b)
    try:
        code, r = _post(url + "/chat/completions", {"messages": [{"role": "user", "content": "a" * 900_000}]})
        assert code == 400 and "cannot fit" in r["error"]["message"] and not calls
        code, r = _post(url + "/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert code == 200 and calls == [1]
    finally:
        srv.shutdown()


def test_scope_serve_needs_a_key_off_loopback_and_checks_it():
    import openai

    from scope.models.server import make_server

    b = tiny_backend(load_tokenizer("tiny-random"), seed=4)
    with pytest.raises(ValueError, match="needs an API key"):
        make_server(b, host="0.0.0.0", port=0)
    srv, url = serve_in_thread(b, api_key="s3cret")
    try:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
        ok = openai.OpenAI(base_url=url, api_key="s3cret", max_retries=0)
        r = ok.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert r.choices[0].message.content is not None
    finally:
        srv.shutdown()
