"""Plain PyTorch versions of the flashgrad ops the demo model calls.

They are the oracle of the demo's gradient check: autograd differentiates them, so whatever
backward flashgrad implements by hand is compared with the gradient of the textbook formula.
Both follow the contract in the design notes (attention.md, delta_rule.md) and compute in fp32
(fp64 for fp64 inputs).
"""

from __future__ import annotations

import torch


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                      softcap: float = 0.0, causal: bool = True,
                      scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention with tanh softcap, bottom-right causal mask and GQA.

    q [B, Sq, Hq, D], k [B, Sk, Hk, D], v [B, Sk, Hk, Dv]  ->  out [B, Sq, Hq, Dv], lse [B, Hq, Sq].
    Query head h reads kv head h // (Hq // Hk).
    """
    dtype = q.dtype
    compute = torch.promote_types(dtype, torch.float32)  # fp32, or fp64 for fp64 inputs
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    batch, seq_q, heads_q, head_dim = q.shape
    seq_k, heads_k = k.shape[1], k.shape[2]
    if scale is None:
        scale = head_dim ** -0.5
    group = heads_q // heads_k
    # repeat_interleave puts kv head j at query heads j*group .. j*group+group-1, i.e. h -> h // group.
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)

    scores = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if causal:
        # Bottom-right alignment: query i stands at key position i + Sk - Sq and sees keys j <= that.
        query_pos = torch.arange(seq_q, device=q.device)[:, None] + (seq_k - seq_q)
        key_pos = torch.arange(seq_k, device=q.device)[None, :]
        scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)                      # [B, Hq, Sq]
    probs = torch.exp(scores - lse[..., None])
    out = torch.einsum("bhij,bjhd->bihd", probs, v)
    return out.to(dtype), lse


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum x^2 + 1e-6) over the last axis (the op's use_qk_l2norm_in_kernel rule)."""
    return x * torch.rsqrt(x.pow(2).sum(dim=-1, keepdim=True) + 1e-6)


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, *, scale: float | None = None,
                     use_qk_l2norm: bool = False) -> torch.Tensor:
    """The gated delta rule, one time step after the other, state in fp32.

    q, k [B, T, H, K], v [B, T, HV, V], g (natural-log decay) and beta [B, T, HV] -> o [B, T, HV, V].
    Per value head, with state S (K x V, fp32 or fp64) starting at zero:
        S~ = exp(g_t) S;  r = v_t - S~^T k_t;  S = S~ + k_t (beta_t r)^T;  o_t = scale S^T q_t
    """
    dtype = q.dtype
    compute = torch.promote_types(dtype, torch.float32)  # fp32, or fp64 for fp64 inputs
    q, k, v, g, beta = (x.to(compute) for x in (q, k, v, g, beta))
    batch, steps, heads, key_dim = q.shape
    value_heads, value_dim = v.shape[2], v.shape[3]
    if scale is None:
        scale = key_dim ** -0.5
    if use_qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    # Value head j reads q/k head j // (HV // H).
    group = value_heads // heads
    q = q.repeat_interleave(group, dim=2)
    k = k.repeat_interleave(group, dim=2)

    state = q.new_zeros(batch, value_heads, key_dim, value_dim)
    outputs = []
    for t in range(steps):
        q_t, k_t, v_t = q[:, t], k[:, t], v[:, t]               # [B, HV, K|V]
        state = state * torch.exp(g[:, t])[..., None, None]
        error = v_t - torch.einsum("bhkv,bhk->bhv", state, k_t)
        update = beta[:, t, :, None] * error
        state = state + k_t[..., :, None] * update[..., None, :]
        outputs.append(scale * torch.einsum("bhkv,bhk->bhv", state, q_t))
    return torch.stack(outputs, dim=1).to(dtype)
