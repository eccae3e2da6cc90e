"""A CPU attention function for sampling with grouped-query attention (GQA) and a padding mask.

transformers' ``sdpa`` path copies every key/value head ``num_key_value_groups`` times (``repeat_kv``)
whenever a mask is given, which during a batched rollout means copying the whole KV cache of every
layer for each prefill of a new turn. Here the query heads that share a key/value head are folded
into the query length instead, so the cache is read as it is:

- one query token (decoding): two matmuls and a softmax; ``q @ K^T`` goes through the key cache's
  transposed storage (see ``local._SlabLayer``), which it reads with unit stride;
- several query tokens with a mask (a turn prefilled on top of a cache): SDPA on the folded heads.

A prefix that all rows of the batch share (their common system prompt) may be given apart from the
cache as ``scope_prefix``, a per-layer list of (transposed keys [kv heads, head_dim, S], values
[kv heads, S, head_dim]) that every query attends to before its own keys: a decoding step then reads
those key/values once for the whole batch instead of once per row (a "cascade"; the scores of both
blocks go through one softmax).

Everything else (training with gradients, no mask, float masks, sinks, soft-capping) goes to
transformers' own ``sdpa`` function unchanged. Measured on the embedded model at 32 rows: see
``benchmarks/rollout_throughput.py`` and the README.
"""
from __future__ import annotations

import torch

NAME = "scope_sdpa"


def _fallback(*args, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(*args, **kwargs)


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
              scope_prefix=None, **kwargs):
    """Same contract as transformers' ``sdpa_attention_forward``: returns ([B, q, heads, dim], None)."""
    masked = attention_mask is not None
    if (torch.is_grad_enabled() or dropout or (not masked and query.shape[2] > 1 and scope_prefix is None)
            or (masked and (attention_mask.dtype != torch.bool or attention_mask.dim() != 4
                            or attention_mask.shape[1] != 1)) or kwargs.get("softcap") is not None
            or kwargs.get("sinks") is not None or kwargs.get("position_bias") is not None
            or query.shape[-1] != value.shape[-1]):
        if scope_prefix is not None:
            raise ValueError("a shared key/value prefix needs the sampling path of this attention "
                             "(no gradients, a boolean padding mask)")
        return _fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                         is_causal=is_causal, **kwargs)
    b, h, q, d = query.shape
    kh, n = key.shape[1], key.shape[2]
    rep = h // kh
    scale = scaling if scaling is not None else d ** -0.5
    # query heads [j*rep, (j+1)*rep) use key/value head j: fold them into the query length
    qf = query.reshape(b, kh, rep * q, d)
    pre = scope_prefix[module.layer_idx] if scope_prefix is not None else None
    if q == 1:
        qf = qf * scale
        s = torch.matmul(qf, key.transpose(-1, -2))
        if pre is None:
            if masked:
                s.masked_fill_(~attention_mask, float("-inf"))  # mask [B, 1, 1, n] broadcasts over heads
            out = torch.matmul(torch.softmax(s, dim=-1), value)
        else:
            # the shared block: all rows' queries of a key/value head against its keys, in one product
            kt0, v0 = pre
            m = kt0.shape[-1]
            s0 = torch.matmul(qf.transpose(0, 1).reshape(kh, b * rep, d), kt0)  # [kh, B*rep, S]
            s = torch.cat([s0.view(kh, b, rep, m).transpose(0, 1), s], dim=-1)
            if masked:
                s[..., m:].masked_fill_(~attention_mask, float("-inf"))
            p = torch.softmax(s, dim=-1)
            out = torch.matmul(p[..., m:], value)
            o0 = torch.matmul(p[..., :m].transpose(0, 1).reshape(kh, b * rep, m), v0)
            out += o0.view(kh, b, rep, d).transpose(0, 1)
    else:
        if pre is not None:  # a prefill on top of the shared block: give each row its keys ahead of the own ones
            kt0, v0 = pre
            m = kt0.shape[-1]
            if not masked:  # transformers leaves out an all-causal mask: the queries are the last q keys
                attention_mask = torch.ones(q, n, dtype=torch.bool, device=query.device).tril_(n - q).expand(b, 1, q, n)
            key = torch.cat([kt0.transpose(-1, -2).expand(b, kh, m, d), key], dim=2)
            value = torch.cat([v0.expand(b, kh, m, d), value], dim=2)
            attention_mask = torch.cat([attention_mask.new_ones(b, 1, q, m), attention_mask], dim=-1)
            n += m
        mask = attention_mask[:, :, None].expand(b, 1, rep, q, n).reshape(b, 1, rep * q, n)
        # (the cache hands out keys as a transposed view; SDPA's CPU kernel wants them row-major)
        out = torch.nn.functional.scaled_dot_product_attention(qf, key.contiguous(), value, attn_mask=mask,
                                                               scale=scale)
    return out.reshape(b, h, q, d).transpose(1, 2).contiguous(), None


def install(model) -> bool:
    """Use this attention for ``model`` if it runs transformers' ``sdpa`` on the CPU; True if it does."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    cfg = getattr(model, "config", None)
    try:
        device = next(model.parameters()).device
    except StopIteration:
        return False
    if cfg is None or getattr(cfg, "_attn_implementation", None) != "sdpa" or device.type != "cpu":
        return False
    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # masks are built exactly as for sdpa
    cfg._attn_implementation = NAME
    return True
