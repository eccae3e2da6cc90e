"""The local backend: batched sampling, log-probs, KV reuse across turns, stop strings, adapters."""
import os
import time

import pytest
import torch

from scope.models.loading import load_backend, load_tokenizer, tiny_backend
from scope.types import SamplingParams


@pytest.fixture()
def b():
    return tiny_backend(load_tokenizer("tiny-random"), seed=0)


def enc(b, msgs, gen=True):
    tok = b.tokenizer
    return tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen),
               add_special_tokens=False)["input_ids"]


def teacher_forced_logprobs(b, prompt, out, temperature):
    with torch.no_grad():
        lg = b.model(torch.tensor([prompt + out])).logits[0].float() / temperature
    return torch.log_softmax(lg, -1)[len(prompt) - 1:-1].gather(-1, torch.tensor(out)[:, None])[:, 0]


def test_batched_logprobs_match_a_full_forward_also_with_kv_reuse(b):
    prompts = [enc(b, [{"role": "user", "content": "hi"}]),
               enc(b, [{"role": "system", "content": "a much longer system prompt"},
                       {"role": "user", "content": "yo"}])]
    sp = SamplingParams(temperature=0.9, max_new_tokens=12)
    outs = b.generate(prompts, sp, sessions=["x", "y"])
    for p, o in zip(prompts, outs):
        assert len(o.token_ids) == len(o.logprobs) > 0
        assert torch.allclose(teacher_forced_logprobs(b, p, o.token_ids, 0.9), torch.tensor(o.logprobs), atol=1e-4)
    # second turn: the cached key/values of the first call are reused (only the new tokens are prefilled)
    nxt = [p + o.token_ids + ([b.eos_ids[0]] if o.finish_reason != "eos" else []) + enc(b, [{"role": "user",
           "content": "more"}])[0:] for p, o in zip(prompts, outs)]
    assert all(len(b.kv_store[k].ids) < len(n) for k, n in zip(["x", "y"], nxt))
    outs2 = b.generate(nxt, sp, sessions=["x", "y"])
    for p, o in zip(nxt, outs2):
        assert torch.allclose(teacher_forced_logprobs(b, p, o.token_ids, 0.9), torch.tensor(o.logprobs), atol=1e-4)


def test_greedy_batch_equals_one_at_a_time(b):
    prompts = [enc(b, [{"role": "user", "content": t}]) for t in ["a", "hello there", "x y z w"]]
    sp = SamplingParams(temperature=0.0, max_new_tokens=10)
    batched = [o.token_ids for o in b.generate(prompts, sp)]
    single = [b.generate([p], sp)[0].token_ids for p in prompts]
    assert batched == single


def test_finish_reasons_and_stop_strings(b):
    p = enc(b, [{"role": "user", "content": "hi"}])
    o = b.generate([p], SamplingParams(temperature=1.0, max_new_tokens=5))[0]
    assert o.finish_reason in ("length", "eos") and len(o.token_ids) <= 5
    # a stop string that is the first sampled character stops right there
    greedy = b.generate([p], SamplingParams(temperature=0.0, max_new_tokens=8))[0]
    first = b.tokenizer.decode(greedy.token_ids[:1])
    if greedy.token_ids[0] not in b.eos_ids:
        o = b.generate([p], SamplingParams(temperature=0.0, max_new_tokens=8, stop=(first,)))[0]
        assert o.finish_reason == "stop" and o.token_ids == greedy.token_ids[:1]


def test_top_p_keeps_only_the_nucleus(b):
    p = enc(b, [{"role": "user", "content": "hi"}])
    with torch.no_grad():
        lg = b.model(torch.tensor([p])).logits[0, -1].float()
    top = int(lg.argmax())
    outs = b.generate([p] * 16, SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=1))
    assert all(o.token_ids[0] == top for o in outs)


def test_adapters_share_one_base(b):
    b.add_lora("agent", r=4, alpha=8)
    b.add_lora("other", r=4, alpha=8)
    assert b.adapter_names() == ["agent", "other"]
    with torch.no_grad():
        for n, prm in b.model.named_parameters():
            if "lora_B" in n and ".agent." in n:
                prm.add_(0.5)
    p = enc(b, [{"role": "user", "content": "hi"}])
    sp = SamplingParams(temperature=0.0, max_new_tokens=6)
    base = b.generate([p], sp, adapter=None)[0]
    other = b.generate([p], sp, adapter="other")[0]
    agent = b.generate([p], sp, adapter="agent")[0]
    assert base.token_ids == other.token_ids  # a fresh adapter equals the base
    assert agent.logprobs != base.logprobs
    params = b.set_trainable("agent")
    assert params and all(".agent." in n for n, prm in b.model.named_parameters() if any(prm is q for q in params))
    with pytest.raises(KeyError, match="no adapter 'missing'"):
        b.generate([p], sp, adapter="missing")


def test_adapter_switch_gives_peft_s_weights_and_leaves_requires_grad_alone(b):
    """``using`` switches adapters by setting each LoRA layer's active adapter (not PEFT's set_adapter):
    the forward pass equals PEFT's for every adapter and for the base, the previous adapter comes back,
    and no adapter's requires_grad changes (learners set their own); a learner still trains after PEFT's
    set_adapter turned its adapter's requires_grad off."""
    from scope.learner import Learner, LearnerConfig
    from scope.types import Trace

    for name in ("one", "two", "three"):
        b.add_lora(name, r=4, alpha=8)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, prm in b.model.named_parameters():
            if "lora_B" in n:
                prm.copy_(torch.randn(prm.shape, generator=g) * 0.1)
    x = torch.tensor([[1, 5, 9, 3, 7]])
    grads = {n: prm.requires_grad for n, prm in b.model.named_parameters()}
    ours = {}
    with torch.no_grad():
        for ad in ("one", "two", "three", None):
            with b.using(ad):
                ours[ad] = b.model(x).logits
        assert b.model.active_adapter == "one"  # the adapter active before is active again
        assert {n: prm.requires_grad for n, prm in b.model.named_parameters()} == grads
        for ad in ("two", "three", "one"):
            b.model.set_adapter(ad)  # PEFT's own switch
            assert torch.equal(b.model(x).logits, ours[ad]), ad
        with b.model.disable_adapter():
            assert torch.equal(b.model(x).logits, ours[None])
    assert not torch.equal(ours["one"], ours["two"])
    learner = Learner(b, "two", LearnerConfig(lr=1e-2, kl_coef=0.0))
    b.add_lora("four", r=4, alpha=8)
    b.model.set_adapter("four")  # PEFT's own switch turns every other adapter's requires_grad off ...
    with b.using("one"):
        pass
    before = {n: prm.detach().clone() for n, prm in b.model.named_parameters() if ".two." in n and "lora_" in n}
    ids = list(range(3, 15))
    t = Trace(role="agent", token_ids=ids, logprobs=[-2.0] * len(ids), mask=[0] * 6 + [1] * 6)
    learner.update([t, t], [1.0, -0.5])
    moved = [n for n, prm in b.model.named_parameters() if n in before and not torch.equal(prm, before[n])]
    assert moved  # ... and the learner's adapter trains all the same


@pytest.mark.slow
def test_embedded_smollm2_loads_from_its_dequantized_cache():
    from scope.models.loading import cache_root

    t = time.time()
    eb = load_backend("smollm2-135m")
    assert os.path.exists(os.path.join(cache_root(), "smollm2-135m", "model.safetensors"))
    assert getattr(eb.model.config, "quantization_config", None) is None
    assert eb.tokenizer.chat_template and eb.eos_ids == [eb.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    tok = eb.tokenizer
    p = tok(tok.apply_chat_template([{"role": "user", "content": "Say hello."}], tokenize=False,
                                    add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    o = eb.generate([p, p], SamplingParams(temperature=0.0, max_new_tokens=8))
    assert o[0].token_ids == o[1].token_ids and o[0].text.strip()
    print(f"embedded load + generate: {time.time() - t:.1f}s")


def test_identical_prompts_share_one_prefill_but_sample_independently(b):
    p = enc(b, [{"role": "user", "content": "hello"}])
    q = p[:-1] + [40, 41] + p[-1:]
    prompts = [p, q, p, p]
    outs = b.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=10), sessions=[1, 2, 3, 4])
    for pr, o in zip(prompts, outs):
        assert torch.allclose(teacher_forced_logprobs(b, pr, o.token_ids, 1.0), torch.tensor(o.logprobs), atol=1e-4)
    assert len({tuple(o.token_ids) for o in outs}) == 4
    assert all(b.kv_store[k].ids[:len(pr)] == pr for k, pr in zip([1, 2, 3, 4], prompts))


def _forward_shapes(b):
    shapes = []
    b.model.register_forward_pre_hook(
        lambda m, args, kw: shapes.append(tuple(kw.get("input_ids", args[0] if args else None).shape)),
        with_kwargs=True)
    return shapes


@pytest.mark.parametrize("chunk", [768, 10])
def test_shared_prefix_and_partial_session_reuse_keep_logprobs_exact(chunk, monkeypatch):
    # grouped-query attention (4 query heads, 2 key/value heads) exercises the folded-head attention;
    # chunk=10 makes the prefill go one row at a time, shortest first
    from scope.models import decode

    monkeypatch.setattr(decode, "PREFILL_CHUNK_TOKENS", chunk)
    # slab columns that are not written must be zeroed or never read: NaN there would reach the log-probs
    monkeypatch.setattr(decode, "_uninitialized", lambda *a, **k: torch.full(*a, float("nan"), **k))
    b = tiny_backend(load_tokenizer("tiny-random"), seed=1, heads=4, kv_heads=2)
    b.min_shared_prefix = 8
    system = {"role": "system", "content": "one long system prompt that every row starts with"}
    prompts = [enc(b, [system, {"role": "user", "content": u}]) for u in ["first persona", "second", "x"]]
    lcp = next(i for i in range(len(prompts[0])) if len({p[i] for p in prompts}) > 1)
    shapes = _forward_shapes(b)
    sp = SamplingParams(temperature=0.8, max_new_tokens=10)
    outs = b.generate(prompts, sp, sessions=["a", "b", "c"])
    assert shapes[0] == (1, lcp)                                   # the common prefix, once
    rests = sorted(len(p) - lcp for p in prompts)                 # then only the rest of each prompt:
    assert shapes[1:4] == ([(3, rests[-1]), (3, 1), (3, 1)] if chunk >= 3 * rests[-1]  # in one chunk
                           else [(1, r) for r in rests])          # or one chunk per row, each as long as its own
    for p, o in zip(prompts, outs):
        assert torch.allclose(teacher_forced_logprobs(b, p, o.token_ids, 0.8), torch.tensor(o.logprobs), atol=1e-4)
    # the sessions hold the common prefix once, by reference, and only their own tokens per row
    root = b.kv_store["a"].shared
    assert root is not None and all(b.kv_store[k].shared is root for k in "abc") and len(root.ids) == lcp
    assert all(sum(v.shape[1] for _, v in b.kv_store[k].layers[0]) == len(b.kv_store[k].ids) - lcp for k in "abc")
    # a second turn of all three: the shared block is attended once per step (cascade), log-probs stay exact
    nxt = {k: p + o.token_ids + ([b.eos_ids[0]] if o.finish_reason != "eos" else []) + enc(b, [{"role": "user",
           "content": f"turn two {k}"}]) for k, p, o in zip("abc", prompts, outs)}
    outs2 = b.generate(list(nxt.values()), sp, sessions=list(nxt))
    for p, o in zip(nxt.values(), outs2):
        assert torch.allclose(teacher_forced_logprobs(b, p, o.token_ids, 0.8), torch.tensor(o.logprobs), atol=1e-4)
    assert all(b.kv_store[k].shared is root for k in "abc")
    # one row's request differs inside the shared prefix: the rows share only what is still common
    cut = lcp - 3
    third = {"a": nxt["a"][:cut] + [nxt["a"][cut] + 1] + nxt["a"][cut + 1:], "b": nxt["b"] + outs2[1].token_ids}
    for _ in range(2):  # the second call starts from the sessions the first one left
        outs3 = b.generate(list(third.values()), sp, sessions=list(third))
        for p, o in zip(third.values(), outs3):
            assert torch.allclose(teacher_forced_logprobs(b, p, o.token_ids, 0.8), torch.tensor(o.logprobs), atol=1e-4)
        assert b.kv_store["a"].shared is b.kv_store["b"].shared and b.kv_store["a"].start == cut
        third = {k: p + o.token_ids for (k, p), o in zip(third.items(), outs3)}
    # a re-rendered request that differs from the session's last call inside the first user message:
    # the cache is reused up to the first changed token only
    changed = enc(b, [system, {"role": "user", "content": "first person"}, {"role": "assistant", "content": "ok"},
                      {"role": "user", "content": "and now?"}])
    keep = next(i for i in range(len(changed)) if changed[i] != b.kv_store["a"].ids[i])
    shapes.clear()
    o = b.generate([changed], sp, sessions=["a"])[0]
    assert shapes[0] == (1, len(changed) - keep)
    assert torch.allclose(teacher_forced_logprobs(b, changed, o.token_ids, 0.8), torch.tensor(o.logprobs), atol=1e-4)


def test_folded_gqa_attention_equals_sdpa():
    b = tiny_backend(load_tokenizer("tiny-random"), seed=2, heads=4, kv_heads=2)
    assert b.model.config._attn_implementation == "scope_sdpa"
    ids = torch.randint(5, 90, (3, 12))
    att = torch.ones(3, 13, dtype=torch.long)
    att[0, :4] = 0
    att[2, :7] = 0

    def run():
        from scope.models.decode import cache_kw, make_cache
        with torch.no_grad():
            cache = make_cache(2, 13)
            a = b.model(input_ids=ids, attention_mask=att[:, :12], **{cache_kw(b.model): cache}, use_cache=True).logits
            c = b.model(input_ids=ids[:, :1], attention_mask=att, **{cache_kw(b.model): cache}, use_cache=True).logits
        return a, c

    ours = run()
    b.model.config._attn_implementation = "sdpa"
    ref = run()
    real = att[:, :12].bool()
    assert torch.allclose(ours[0][real], ref[0][real], atol=1e-5)
    assert torch.allclose(ours[1], ref[1], atol=1e-5)


def test_stop_fn_stops_a_row_on_its_text(b):
    p = enc(b, [{"role": "user", "content": "hi"}])
    seen = []

    def stop(text):
        seen.append(text)
        return len(text) >= 3

    outs = b.generate([p, p], SamplingParams(temperature=1.0, max_new_tokens=30, stop_fn=stop))
    for o in outs:
        assert o.finish_reason in ("stop", "eos")
        if o.finish_reason == "stop":
            assert len(o.text) == 3  # stopped at the first token that made the text 3 characters long
    assert seen and all(len(t) <= 3 for t in seen)


def test_restart_fn_resamples_in_the_batch_and_masks_the_discarded_attempt():
    b = tiny_backend(load_tokenizer("tiny-random"), seed=3, heads=4, kv_heads=2)
    prompts = [enc(b, [{"role": "user", "content": "hello"}]), enc(b, [{"role": "user", "content": "a longer one"}])]
    sp = SamplingParams(temperature=1.0, max_new_tokens=20, restart_fn=lambda t: len(t) >= 4, max_restarts=1)
    outs = b.generate(prompts, sp, sessions=["r0", "r1"])
    restarted = [o for o in outs if o.discarded]
    assert restarted, "with 20 tokens every row reaches 4 characters unless it ends first"
    for p, o in zip(prompts, outs):
        assert len(o.discarded) <= 1 and all(len(t) == 4 for t in o.discarded)
        assert o.discarded_tokens >= 4 * len(o.discarded)
        # the final attempt's log-probs are those of the prompt alone: the discarded tokens are invisible
        assert torch.allclose(teacher_forced_logprobs(b, p, o.token_ids, 1.0), torch.tensor(o.logprobs), atol=1e-4)
        # and the session cache holds exactly the prompt and the final attempt
        assert b.kv_store[f"r{prompts.index(p)}"].ids == p + o.token_ids[:-1]
        assert sum(v.shape[1] for _, v in b.kv_store[f"r{prompts.index(p)}"].layers[0]) == len(p) + len(o.token_ids) - 1


def test_packed_weights_match_plain_linear_and_follow_weight_changes(b):
    from scope.models import packed

    if not b.packed.enabled:
        pytest.skip("this torch build has no MKL packed GEMM")
    lin = b.model.model.layers[0].mlp.down_proj
    x = torch.randn(5, 3, lin.in_features)
    with torch.inference_mode():
        plain = torch.nn.functional.linear(x, lin.weight)
        with b.packed.active(b.model):
            assert "forward" in lin.__dict__
            out = lin(x)
        assert "forward" not in lin.__dict__  # the plain forward is back after the block
    assert torch.allclose(out, plain, atol=1e-5) and lin in b.packed._packs
    first = b.packed._packs[lin][2]
    # an in-place update (as an optimizer step makes in full fine-tuning) is seen: packed anew
    with torch.no_grad():
        lin.weight.mul_(1.5)
    with torch.inference_mode(), b.packed.active(b.model):
        again = lin(x)
    assert b.packed._packs[lin][2] is not first
    assert torch.allclose(again, torch.nn.functional.linear(x, lin.weight), atol=1e-5)
    # a single row, too many rows and gradients take the plain path
    with b.packed.active(b.model):
        y = lin(x[:1, :1].requires_grad_())
        assert y.requires_grad
    assert packed.MAX_ROWS < 1000


def test_packed_sampling_logprobs_match_a_full_forward(b):
    """The batched decode (several rows: packed weights) still gives teacher-forced log-probs, also after
    the weights changed between calls (full fine-tuning)."""
    prompts = [enc(b, [{"role": "user", "content": t}]) for t in ["hi", "hello there", "x", "what now?"]]
    sp = SamplingParams(temperature=0.8, max_new_tokens=10)
    for _ in range(2):
        outs = b.generate(prompts, sp)
        for p, o in zip(prompts, outs):
            assert torch.allclose(teacher_forced_logprobs(b, p, o.token_ids, 0.8), torch.tensor(o.logprobs), atol=1e-4)
        with torch.no_grad():
            for prm in b.model.parameters():
                prm.add_(0.01 * torch.randn_like(prm))
    assert b.packed._packs or not b.packed.enabled
