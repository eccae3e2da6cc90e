"""Token in, token out: the trace built turn by turn is exactly the chat template of the dialogue."""
import pytest
import random

from scope.envs.base import get_env
from scope.rollout import Job, run_rollouts
from scope.types import Episode, SamplingParams

from helpers import ScriptedRef

AGENT = ["Hello! Would you give a little to Save the Children?", "Even $1 feeds a child for a day.",
         "Thank you, that means a lot."]
PARTNER = ["Hmm, who are they?", "I'm not sure, money is tight.", "Alright. [DONATE $1.5]"]


def run_p4g(tok, agent_replies=AGENT, partner_replies=PARTNER, cut_off=(), max_turns=10):
    env_cls = get_env("p4g")
    task = env_cls.load_tasks("train")[0]
    env = env_cls(task, random.Random(0), max_turns=max_turns)
    agent = ScriptedRef(tok, agent_replies, "agent", cut_off=cut_off)
    partner = ScriptedRef(tok, partner_replies, "partner")
    job = Job(env=env, episode=Episode(task.id, "g", 0), bindings={"agent": agent, "partner": partner})
    sp = {"agent": SamplingParams(max_new_tokens=64), "partner": SamplingParams(max_new_tokens=64)}
    eps, _ = run_rollouts([job], sp, end_on_truncation=False)
    return eps[0], env, agent, partner


def template_ids(tok, view):
    return tok(tok.apply_chat_template(view, tokenize=False), add_special_tokens=False)["input_ids"]


def test_agent_buffer_equals_chat_template_of_whole_conversation(smol_tokenizer):
    tok = smol_tokenizer
    ep, env, agent, partner = run_p4g(tok)
    assert ep.status == "done" and ep.rewards["agent"] == 0.75
    for role in ("agent", "partner"):
        tr = ep.traces[role]
        assert tr.token_ids == template_ids(tok, env.views[role]), role
        assert len(tr.mask) == len(tr.logprobs) == len(tr.token_ids)


def test_masks_cover_exactly_the_roles_own_tokens(smol_tokenizer):
    tok = smol_tokenizer
    ep, env, agent, partner = run_p4g(tok)
    tr = ep.traces["agent"]
    own = [t for t, m in zip(tr.token_ids, tr.mask) if m]
    expected = []
    for text in AGENT:
        expected += tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert own == expected
    # every partner reply and the environment's opening message lie in mask-0 spans of the agent trace
    text_of_mask0 = tok.decode([t for t, m in zip(tr.token_ids, tr.mask) if not m])
    for text in PARTNER + ["A stranger has joined the chat"]:
        assert text in text_of_mask0
    # log-probs are kept only for generated tokens
    assert all(lp == -0.5 for lp, m in zip(tr.logprobs, tr.mask) if m)
    assert all(lp == 0.0 for lp, m in zip(tr.logprobs, tr.mask) if not m)
    # the partner's trace has the mirror image
    ptr = ep.traces["partner"]
    pown = tok.decode([t for t, m in zip(ptr.token_ids, ptr.mask) if m])
    assert all(t in pown for t in PARTNER) and not any(t in pown for t in AGENT)


def test_each_prompt_is_the_previous_buffer_extended(smol_tokenizer):
    """The model is never sent a re-templated conversation: each prompt extends the last one."""
    ep, env, agent, partner = run_p4g(smol_tokenizer)
    prompts = [c[0] for c in agent.calls]
    for a, b in zip(prompts, prompts[1:]):
        assert b[:len(a)] == a


def test_cut_off_turn_is_truncated_and_closed_with_mask_zero(smol_tokenizer):
    tok = smol_tokenizer
    ep, env, agent, partner = run_p4g(tok, cut_off={0})
    tr = ep.traces["agent"]
    first = tok(AGENT[0], add_special_tokens=False)["input_ids"]
    # find the first generated span: it is the reply without eos, followed by an eos with mask 0
    start = tr.mask.index(1)
    span = tr.token_ids[start:start + len(first)]
    assert span == first
    assert tr.token_ids[start + len(first)] == tok.eos_token_id
    assert tr.mask[start + len(first)] == 0
    assert tr.token_ids == template_ids(tok, env.views["agent"])


def test_cut_off_turn_ends_episode_as_truncated(smol_tokenizer):
    tok = smol_tokenizer
    env_cls = get_env("p4g")
    task = env_cls.load_tasks("train")[0]
    env = env_cls(task, random.Random(0))
    job = Job(env=env, episode=Episode(task.id, "g", 0),
              bindings={"agent": ScriptedRef(tok, AGENT, cut_off={1}), "partner": ScriptedRef(tok, PARTNER)})
    sp = {"agent": SamplingParams(max_new_tokens=64), "partner": SamplingParams(max_new_tokens=64)}
    eps, _ = run_rollouts([job], sp, end_on_truncation=True)
    assert eps[0].status == "truncated" and eps[0].truncated_replies == {"agent": 1}
    assert eps[0].traces["agent"].n_turns == 2
    from scope.train import episode_metrics

    m = episode_metrics(eps)
    assert m["truncated_replies/agent"] == 1 and m["truncated_replies/partner"] == 0 and m["status/truncated"] == 1.0


def test_truncation_is_handled_alike_in_training_and_evaluation(smol_tokenizer):
    """The panel evaluation ends a cut-off episode as training does, and counts it per partner."""
    from scope.config import EnvConfig
    from scope.eval import evaluate, load_panel
    from scope.partners.binding import Binding

    class Refs(dict):
        def __missing__(self, k):
            raise KeyError(k)

    tok = smol_tokenizer
    panel = load_panel({"partners": [{"id": "p", "model": "m", "seen": True}], "episodes": 2})
    agent = Binding("a", ScriptedRef(tok, AGENT, cut_off={0, 1, 2, 3}), SamplingParams(max_new_tokens=64))
    refs = Refs(m=ScriptedRef(tok, PARTNER))
    for end in (True, False):
        agent.n = 0
        res = evaluate(agent, panel, refs, EnvConfig(name="p4g", options={"max_turns": 2}), "test",
                       end_on_truncation=end)
        assert res["per_partner"]["p"]["truncated"] == (2 if end else 0)
        assert ({e["status"] for e in res["episodes"]} == {"truncated"}) == end
        assert all(e["truncated_replies"]["agent"] >= 1 for e in res["episodes"])


def test_the_variance_decomposition_ends_cut_off_replays_as_training_does(smol_tokenizer):
    """Replays whose partner reply is cut off end as truncated, as in training, unless end_on_truncation is
    off (then they go on, and here the persuadee gives on the next turn)."""
    import random

    from scope.envs.base import get_env
    from scope.eval import nested_variance
    from scope.partners.binding import Binding
    from scope.types import Episode

    task = get_env("p4g").load_tasks("test")[0]
    ep = Episode(task.id, "g", 0)
    ep.messages = [{"role": "agent", "content": "Would you donate?"}, {"role": "agent", "content": "Please?"}]
    parts = {}
    for end in (True, False):  # two dialogues x two replays; the first replay of each is cut off on turn 1
        replies = ["Hmm, let me think."] * 4 + ["Fine. [DONATE $2]"] * 4
        partner = Binding("p", ScriptedRef(smol_tokenizer, replies, cut_off={0, 2}), SamplingParams(max_new_tokens=64))
        parts[end] = nested_variance([ep, ep], {task.id: task}, SamplingParams(),
                                     lambda e, partner=partner: partner, "p4g",
                                     {"max_turns": 2}, 2, random.Random(0), end_on_truncation=end)
    assert parts[True]["partner"] == pytest.approx(0.5) and parts[True]["agent"] == 0.0  # rows [0, 1], [0, 1]
    assert parts[False]["partner"] == 0.0 and parts[False]["total"] == 0.0
