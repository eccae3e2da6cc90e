"""Decision readouts (scope.models.readout) with a generic readout: the number a reply starts with (up to two
digits), read from the model's own next-token distributions.

The tiny model gets an output layer with a bias toward the digits, so that the number after the prompt has a
distribution worth checking (a random tiny model rarely writes a digit), and some of its mass needs a second
token to settle (a first digit that a second may follow)."""
import statistics

import pytest
import torch

from scope.rollout import encode, render
from scope.types import Readout, SamplingParams

NONE = "none"


def number(text: str, final: bool):
    """The number ``text`` starts with, up to two digits; ``none`` for a reply that starts otherwise; None while
    the text so far could still change it (one digit and no end yet)."""
    digits = len(text) - len(text.lstrip("0123456789"))
    if digits == 0:
        return NONE if text or final else None
    if digits >= 2:
        return int(text[:2])
    return int(text[0]) if final or len(text) > 1 else None


NUMBER = Readout(outcome=number, max_tokens=3)


def value(outcome) -> float:
    return 0.0 if outcome == NONE else outcome / 99


def digit_biased(backend, seed: int = 0):
    """Give the tiny model an untied output layer whose bias favours the digits and a few closers."""
    tok = backend.tokenizer
    m = backend.model
    w = m.get_output_embeddings().weight
    head = torch.nn.Linear(w.shape[1], w.shape[0], bias=True)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.weight.copy_(w)
        head.bias.zero_()
        for s, b in [(str(d), 9.0 + 2 * torch.rand(1, generator=g).item()) for d in range(10)] + \
                [(".", 9.5), ("]", 9.0)]:
            head.bias[tok.convert_tokens_to_ids(s)] = b
    m.lm_head = head
    m.config.tie_word_embeddings = False
    return backend


def prompts(tok, n):
    return [encode(tok, render(tok, [{"role": "system", "content": "Answer with a number."},
                                     {"role": "user", "content": f"Question {i}: how many?"}], True) + "Number: ")
            for i in range(n)]


def test_the_generic_readout_waits_while_the_text_could_change_it():
    assert number("", False) is None and number("", True) == NONE and number("x", False) == NONE
    assert number("4", False) is None and number("4", True) == 4 and number("4.", False) == 4
    assert number("42", False) == 42 and number("07", False) == 7


@pytest.mark.long
def test_the_expectation_is_the_mean_of_sampled_values_within_its_standard_error(tiny):
    """The readout's exact expectation against the engine's own sampler (generate), 2000 draws per prompt,
    and against the readout's own draws; the distribution sums to one."""
    b = digit_biased(tiny)
    tok = b.tokenizer
    sp = SamplingParams(temperature=0.8, max_new_tokens=3)
    for p, r in zip(prompts(tok, 2), b.readout(prompts(tok, 2), sp, NUMBER)):
        assert sum(r.dist.values()) == pytest.approx(1.0, abs=1e-6)
        ev = sum(q * value(k) for k, q in r.dist.items())
        # the check means something: mass on numbers that a second token settled, and not all of it
        two = sum(q for k, q in r.dist.items() if k != NONE and k >= 10)
        assert 0.05 < two < 0.95 and 0.02 < ev < 0.98
        outs = b.generate([p] * 2000, sp)
        sampled = [value(number(tok.decode(c.token_ids[:-1] if c.finish_reason == "eos" else c.token_ids), True))
                   for c in outs]
        m, se = statistics.mean(sampled), statistics.stdev(sampled) / len(sampled) ** 0.5
        assert abs(m - ev) < 3 * se, (m, ev, se)
        own = [value(x.outcome) for x in b.readout([p] * 1000, sp, NUMBER)]
        m2, se2 = statistics.mean(own), statistics.stdev(own) / len(own) ** 0.5
        assert abs(m2 - ev) < 3 * se2, (m2, ev, se2)


def test_a_batched_readout_equals_one_prompt_at_a_time_and_its_draw_carries_its_log_probs(tiny):
    b = digit_biased(tiny)
    tok = b.tokenizer
    sp = SamplingParams(temperature=0.7, max_new_tokens=3)
    ps = prompts(tok, 4)
    together = b.readout(ps, sp, NUMBER)
    for p, r in zip(ps, together):
        alone = b.readout([p], sp, NUMBER)[0]
        assert set(alone.dist) == set(r.dist)
        for k in r.dist:
            assert r.dist[k] == pytest.approx(alone.dist[k], abs=1e-5)
        # the drawn reply's log-probs are those of a teacher-forced forward pass at the temperature
        c = r.completion
        assert 1 <= len(c.token_ids) <= 3 and c.finish_reason == "stop"
        with torch.no_grad():
            logits = b.model(input_ids=torch.tensor([p + c.token_ids])).logits[0].float() / sp.temperature
        lp = torch.log_softmax(logits, -1)
        want = [float(lp[len(p) - 1 + i, t]) for i, t in enumerate(c.token_ids)]
        assert c.logprobs == pytest.approx(want, abs=1e-4)
        assert r.outcome in (number(tok.decode(c.token_ids), len(c.token_ids) == 3),
                             number(tok.decode(c.token_ids), True))


def test_greedy_readout_is_the_greedy_decision(tiny):
    b = digit_biased(tiny)
    p = prompts(b.tokenizer, 1)
    r = b.readout(p, SamplingParams(temperature=0.0, max_new_tokens=3), NUMBER)[0]
    g = b.generate(p, SamplingParams(temperature=0.0, max_new_tokens=3))[0]
    text = b.tokenizer.decode(g.token_ids[:-1] if g.finish_reason == "eos" else g.token_ids)
    assert r.dist == {number(text, True): pytest.approx(1.0)}


def test_simulators_on_one_base_share_the_layers_below_their_adapters_to_the_bit(tiny):
    """A panel reads the same prompts under the base and under adapters on the top layers only: the layers
    below an adapter are run once and shared, and every readout is what it is without the sharing, bit for
    bit (the distributions and the drawn replies), at either temperature and for an adapter on every layer."""
    b = digit_biased(tiny)
    n = b.model.config.num_hidden_layers
    b.add_lora("top", r=4, top_layers=1)
    b.add_lora("all", r=4)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in b.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    assert b._first_layer(None) == n and b._first_layer("top") == n - 1 and b._first_layer("all") == 0
    ps = prompts(b.tokenizer, 3) * 12  # two chunks of up to 32
    plan = [(None, 0.7), ("top", 0.7), (None, 1.0), ("all", 0.7), ("top", 1.0)]

    def read(share: bool):
        b.share_readouts, b._shared = share, None
        b.generator.manual_seed(5)
        out = [b.readout(ps, SamplingParams(temperature=t, max_new_tokens=3), NUMBER, adapter=a) for a, t in plan]
        return out, (b._shared.hits if share else 0)

    plain, _ = read(False)
    shared, hits = read(True)
    assert hits == 2 * 3  # "top" twice and the base at T=1.0 once, two chunks each; "all" runs on its own
    for rs, qs in zip(plain, shared):
        for r, q in zip(rs, qs):
            assert r.dist == q.dist and r.outcome == q.outcome
            assert r.completion.token_ids == q.completion.token_ids and r.completion.logprobs == q.completion.logprobs
    # the adapters do change the readout (the sharing is tested on different weights)
    assert plain[0][0].dist != plain[1][0].dist and plain[0][0].dist != plain[3][0].dist
