"""Plain PyTorch references (direct formulas, no tricks) that the tests compare flashgrad with."""

from __future__ import annotations

import math

import torch


# ---- softmax attention ----------------------------------------------------------------------------


def allowed_mask(sq, sk, mask="none", window=(-1, -1), prefix=None, bounds=None, device="cpu"):
    """[sq, sk] bool: which keys query i may see (docs/attention.md; bottom-right aligned)."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    a = i + sk - sq  # the key position query i stands at
    if mask == "none":
        return torch.ones(sq, sk, dtype=torch.bool, device=device)
    if mask == "causal":
        return j <= a
    if mask == "sliding_window":
        wl, wr = window
        ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
        if wl >= 0:
            ok &= j >= a - wl
        if wr >= 0:
            ok &= j <= a + wr
        return ok
    if mask == "prefix_lm":
        return (j <= a) | ((a < prefix) & (j < prefix))
    if mask == "candidate_isolation":
        h0, h1, c0, c1 = bounds
        j_hist = (j >= h0) & (j < h1)
        i_hist = (i >= h0) & (i < h1)
        i_cand = (i >= c0) & (i < c1)
        return (j_hist & (i_hist | i_cand)) | (i_cand & (j == i))
    raise ValueError(mask)


def softcapped(s, softcap, method):
    if softcap <= 0:
        return s
    if method == "tanh":
        return softcap * torch.tanh(s / softcap)
    return s / (1 + s.abs() / softcap)


def attention_one(q, k, v, allowed, scale, softcap=0.0, method="tanh"):
    """q [Sq, Hq, D], k [Sk, Hk, D], v [Sk, Hk, Dv] -> out [Sq, Hq, Dv], lse [Hq, Sq].
    Fully masked rows: out 0, lse -inf."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = softcapped(torch.einsum("qhd,khd->hqk", q, k) * scale, softcap, method)
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None].clamp_min(torch.finfo(s.dtype).min))
    p = torch.where(allowed, p, torch.zeros_like(p))
    return torch.einsum("hqk,khd->qhd", p, v), lse


def attention_padded(q, k, v, mask="none", window=(-1, -1), scale=None, softcap=0.0, method="tanh",
                     prefix=None, bounds=None):
    """q [B, Sq, Hq, D] ... -> out [B, Sq, Hq, Dv], lse [B, Hq, Sq]."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    outs, lses = [], []
    for b in range(q.shape[0]):
        allowed = allowed_mask(q.shape[1], k.shape[1], mask, window,
                               None if prefix is None else int(prefix[b]),
                               None if bounds is None else [int(x) for x in bounds[b]], q.device)
        o, l = attention_one(q[b], k[b], v[b], allowed, scale, softcap, method)
        outs.append(o)
        lses.append(l)
    return torch.stack(outs), torch.stack(lses)


def attention_varlen(q, k, v, cu_q, cu_k, mask="none", window=(-1, -1), scale=None, softcap=0.0,
                     method="tanh"):
    """q [Tq, Hq, D] ... -> out [Tq, Hq, Dv], lse [Hq, Tq]."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    outs, lses = [], []
    for n in range(len(cu_q) - 1):
        qs, qe, ks, ke = int(cu_q[n]), int(cu_q[n + 1]), int(cu_k[n]), int(cu_k[n + 1])
        allowed = allowed_mask(qe - qs, ke - ks, mask, window, device=q.device)
        o, l = attention_one(q[qs:qe], k[ks:ke], v[ks:ke], allowed, scale, softcap, method)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs), torch.cat(lses, dim=1)


# ---- the gated delta rule ------------------------------------------------------------------------


def l2norm(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def delta_rule_one(q, k, v, g, beta, scale, h0):
    """One sequence: q, k [T, H, K]; v [T, HV, V]; g None, [T, HV] or [T, HV, K]; beta [T, HV];
    h0 [HV, K, V]. Returns o [T, HV, V], final state [HV, K, V] (the recurrence of
    docs/delta_rule.md, step by step)."""
    group = v.shape[1] // q.shape[1]
    q = q.repeat_interleave(group, dim=1)
    k = k.repeat_interleave(group, dim=1)
    S = h0
    outs = []
    for t in range(q.shape[0]):
        if g is not None:
            decay = g[t].exp()
            S = S * (decay[:, None, None] if decay.dim() == 1 else decay[:, :, None])
        r = v[t] - torch.einsum("hk,hkv->hv", k[t], S)
        S = S + torch.einsum("hk,hv->hkv", k[t], beta[t][:, None] * r)
        outs.append(scale * torch.einsum("hk,hkv->hv", q[t], S))
    o = torch.stack(outs) if outs else v.new_zeros(v.shape)
    return o, S


def delta_rule(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, l2=False):
    """fla's layout: q, k [B, T, H, K] ... -> o [B, T, HV, V], final [N, HV, K, V]."""
    if l2:
        q, k = l2norm(q), l2norm(k)
    if scale is None:  # the core's default, K^-0.5 computed in float32 (its scale is a float)
        scale = float(1.0 / torch.tensor(float(q.shape[-1]), dtype=torch.float32).sqrt())
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        spans = [(0, int(cu_seqlens[n]), int(cu_seqlens[n + 1])) for n in range(len(cu_seqlens) - 1)]
    outs, finals = [], []
    for n, (b, s, e) in enumerate(spans):
        h0 = (initial_state[n].to(q.dtype) if initial_state is not None
              else q.new_zeros(HV, K, V))
        o, S = delta_rule_one(q[b, s:e], k[b, s:e], v[b, s:e], None if g is None else g[b, s:e],
                              beta[b, s:e], scale, h0)
        outs.append(o)
        finals.append(S)
    if cu_seqlens is None:
        o = torch.stack(outs)
    else:
        o = torch.cat(outs)[None]
    return o, torch.stack(finals)
