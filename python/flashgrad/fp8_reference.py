"""A plain-PyTorch emulation of flashgrad's FP8 attention recipe (docs/fp8.md), the yardstick
of the CUDA kernels' accuracy (docs/attention.md's 2x rule with X_lowp = this emulation).

Every quantization the recipe performs is applied here as fake quantization (values rounded to
e4m3 or bf16 and kept in float32); every product accumulates in float32. The backward is written
out step by step, as the kernel computes it, not derived by autograd from the forward.

    fp8_attention_reference(q8, k8, v8, dsq, dsk, dsv, ...)              -> out bf16, lse fp32
    fp8_attention_reference_backward(dout, q8, k8, v8, dsq, dsk, dsv,
                                     out, lse, dlse, ...)                 -> dq, dk, dv bf16

With emulate_recipe=False both compute the exact attention in float32 on the dequantized inputs
(nothing else quantized, float32 outputs): X_ref32 of the 2x rule and of the relative RMS errors.

One deliberate simplification (docs/fp8.md, "Emulation"): the forward quantizes
p~ = exp(s - m) with m the final row maximum, where a kernel uses the running maximum of the key
blocks seen so far. Both map every probability to e4m3 with the same relative rounding; they
differ only in which entries fall below e4m3's normal range, a second-order effect the 2x rule
absorbs. Everything else matches the kernel's arithmetic up to float32 summation order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .fp8 import E4M3_MAX, descale_from_amax, round_e4m3


@dataclass(frozen=True)
class AttentionOptions:
    """What the forward and the backward share (FlashAttention's flags, resolved)."""
    causal: bool = False
    softmax_scale: float | None = None
    window_size: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    softcap_method: str = "tanh"
    prefix_lengths: torch.Tensor | None = None     # int [N]
    candidate_bounds: torch.Tensor | None = None   # int [N, 4]
    cu_seqlens_q: torch.Tensor | None = None       # int [N+1]: packed layout
    cu_seqlens_k: torch.Tensor | None = None


def _allowed(opts: AttentionOptions, n: int, sq: int, sk: int, device) -> torch.Tensor:
    """[sq, sk] bool, docs/attention.md's masks (bottom-right aligned: query i at key i + sk - sq)."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    a = i + sk - sq
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if opts.prefix_lengths is not None:
        prefix = int(opts.prefix_lengths[n])
        return (j <= a) | ((a < prefix) & (j < prefix))
    if opts.candidate_bounds is not None:
        h0, h1, c0, c1 = (int(b) for b in opts.candidate_bounds[n])
        j_hist = (j >= h0) & (j < h1)
        i_cand = (i >= c0) & (i < c1)
        return (j_hist & (((i >= h0) & (i < h1)) | i_cand)) | (i_cand & (j == i))
    wl, wr = (max(int(w), -1) for w in opts.window_size)
    if opts.causal:
        wr = 0
    if wl >= 0:
        ok &= j >= a - wl
    if wr >= 0:
        ok &= j <= a + wr
    return ok


def _softcap(raw: torch.Tensor, opts: AttentionOptions) -> torch.Tensor:
    c = opts.softcap
    if c <= 0:
        return raw
    if opts.softcap_method == "tanh":
        return c * torch.tanh(raw / c)
    return raw / (1 + raw.abs() / c)


def _softcap_derivative(raw: torch.Tensor, capped: torch.Tensor, opts: AttentionOptions):
    c = opts.softcap
    if c <= 0:
        return None
    if opts.softcap_method == "tanh":
        return 1 - (capped / c) ** 2
    return 1 / (1 + raw.abs() / c) ** 2


def _spans(q8, k8, opts: AttentionOptions):
    """(n, q token slice, k token slice, batch index or None) per sequence."""
    if opts.cu_seqlens_q is None:
        return [(b, slice(None), slice(None), b) for b in range(q8.shape[0])]
    cq, ck = opts.cu_seqlens_q.tolist(), opts.cu_seqlens_k.tolist()
    return [(n, slice(cq[n], cq[n + 1]), slice(ck[n], ck[n + 1]), None) for n in range(len(cq) - 1)]


@dataclass
class _Scores:
    raw: torch.Tensor      # [Hq, Sq, Sk] scale * <q, k> (dequantized)
    capped: torch.Tensor   # after softcap, -inf where masked
    allowed: torch.Tensor  # [Sq, Sk]


def _scores(q8n, k8n, dsq, dsk, scale, opts, allowed, scores_bf16=False) -> _Scores:
    """S = (q8 . k8^T) * descale_q * descale_k * scale: an fp8 product accumulated in float32,
    then one multiplication by the combined factor, as the kernel's epilogue does. scores_bf16
    rounds S to bf16 (a framework's fp8 GEMM with bf16 output; see fp8_attention_reference)."""
    group = q8n.shape[1] // k8n.shape[1]
    k_rep = k8n.float().repeat_interleave(group, dim=1)
    factor = (dsq * dsk * scale).repeat_interleave(group)          # [Hq]
    raw = torch.einsum("qhd,khd->hqk", q8n.float(), k_rep) * factor[:, None, None]
    if scores_bf16:
        raw = raw.bfloat16().float()
    capped = _softcap(raw, opts).masked_fill(~allowed, -math.inf)
    return _Scores(raw, capped, allowed)


def _default_scale(opts, head_dim):
    # the core's default, 1/sqrt(D) computed in float32
    return float(1.0 / torch.tensor(float(head_dim)).sqrt()) if opts.softmax_scale is None \
        else float(opts.softmax_scale)


def fp8_attention_reference(q8, k8, v8, descale_q, descale_k, descale_v, *, emulate_recipe=True,
                            scores_bf16=False, **options):
    """The recipe's forward on e4m3 q8 [B, Sq, Hq, D] / [Tq, Hq, D] (k8, v8 likewise; descales
    float32 [N, Hk]). options: AttentionOptions' fields. Returns (out, lse): out bf16 (float32
    with emulate_recipe=False), lse float32; fully masked rows give out 0 and lse -inf.

    lse involves none of the recipe's quantizations (l sums the unquantized p~), so the emulated
    lse equals the exact one; scores_bf16=True rounds S to bf16 instead, the precision of a
    framework's fp8 matmul, which the GPU tests use as lse's yardstick (FP8 tensor cores do not
    accumulate in full float32, docs/fp8.md)."""
    opts = AttentionOptions(**options)
    scale = _default_scale(opts, q8.shape[-1])
    out_dtype = torch.bfloat16 if emulate_recipe else torch.float32
    out = torch.zeros(*q8.shape[:-1], v8.shape[-1], dtype=out_dtype, device=q8.device)
    lse_shape = (q8.shape[0], q8.shape[2], q8.shape[1]) if opts.cu_seqlens_q is None \
        else (q8.shape[1], q8.shape[0])
    lse = torch.full(lse_shape, -math.inf, dtype=torch.float32, device=q8.device)
    for n, qrows, krows, b in _spans(q8, k8, opts):
        q8n = q8[b] if b is not None else q8[qrows]
        k8n, v8n = (k8[b], v8[b]) if b is not None else (k8[krows], v8[krows])
        sq, sk = q8n.shape[0], k8n.shape[0]
        if sq == 0:
            continue
        group = q8n.shape[1] // k8n.shape[1]
        allowed = _allowed(opts, n, sq, sk, q8.device)
        s = _scores(q8n, k8n, descale_q[n], descale_k[n], scale, opts, allowed, scores_bf16).capped
        m = s.amax(dim=-1, keepdim=True) if sk > 0 else torch.full_like(s[..., :1], -math.inf)
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p_tilde = torch.exp(s - m_safe)                               # 0 where masked
        row_sum = p_tilde.sum(dim=-1, keepdim=True)                   # l: unquantized p~
        v_rep = v8n.float().repeat_interleave(group, dim=1)
        dsv = descale_v[n].repeat_interleave(group)[:, None, None]    # [Hq, 1, 1]
        if emulate_recipe:
            # O_acc = e4m3(p~ * 448) . v8, fp32 accumulation; out = O_acc * dsv / (448 l)
            acc = torch.einsum("hqk,khd->hqd", round_e4m3(p_tilde * E4M3_MAX), v_rep)
            o = acc * dsv / (E4M3_MAX * row_sum)
        else:
            o = torch.einsum("hqk,khd->hqd", p_tilde, v_rep * dsv[:, :, 0][None]) / row_sum
        o = torch.where(row_sum > 0, o, torch.zeros_like(o))
        row_lse = torch.where(row_sum[..., 0] > 0, m[..., 0] + torch.log(row_sum[..., 0]),
                              torch.full_like(row_sum[..., 0], -math.inf))
        if b is not None:
            out[b] = o.permute(1, 0, 2).to(out_dtype)
            lse[b] = row_lse
        else:
            out[qrows] = o.permute(1, 0, 2).to(out_dtype)
            lse[:, qrows] = row_lse
    return out, lse


def _kernel_descale(amax: torch.Tensor) -> torch.Tensor:
    """amax / 448 (a division, as the CUDA backward's pre-pass computes it), 1 where amax == 0."""
    return torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))


def dout_descale(dout: torch.Tensor, opts: AttentionOptions) -> torch.Tensor:
    """float32 [N, Hq]: amax(|dO| over the sequence's rows of query head h) / 448 (1 if 0): the
    recipe's per-(sequence, query head) scale for the dO . V^T product."""
    if opts.cu_seqlens_q is None:
        amax = dout.abs().amax(dim=(1, 3)).float() if dout.shape[1] > 0 \
            else dout.new_zeros(dout.shape[0], dout.shape[2], dtype=torch.float32)
        return _kernel_descale(amax)
    cq = opts.cu_seqlens_q.tolist()
    rows = [dout[cq[n]:cq[n + 1]].abs().amax(dim=(0, 2)).float() if cq[n + 1] > cq[n]
            else dout.new_zeros(dout.shape[1], dtype=torch.float32) for n in range(len(cq) - 1)]
    amax = torch.stack(rows) if rows else dout.new_zeros(0, dout.shape[1], dtype=torch.float32)
    return _kernel_descale(amax)


def fp8_attention_reference_backward(dout, q8, k8, v8, descale_q, descale_k, descale_v, out, lse,
                                     dlse=None, *, z_loss_weight=0.0, emulate_recipe=True,
                                     ablation=None, **options):
    """The recipe's backward (docs/fp8.md): gradients with respect to the dequantized q, k, v,
    bf16 (float32 with emulate_recipe=False). dout: out's shape (bf16); out, lse: the forward's
    results; dlse: lse's gradient or None; z_loss_weight adds w * lse to dlse.

    ablation (for docs/fp8.md's design study only, not the recipe): "ds_e4m3" feeds dS to the dq
    and dk products as e4m3 with one scale per query row (amax / 448); "p_e4m3" feeds P to the
    dv product as e4m3(p * 448); "dp_bf16" computes dP = dO . v8^T from the bf16 dO (no dO8)."""
    if ablation not in (None, "ds_e4m3", "p_e4m3", "dp_bf16"):
        raise ValueError(f"fp8_attention_reference_backward: argument 'ablation': unknown {ablation!r}")
    opts = AttentionOptions(**options)
    scale = _default_scale(opts, q8.shape[-1])
    grad_dtype = torch.bfloat16 if emulate_recipe else torch.float32
    dq = torch.zeros(q8.shape, dtype=torch.float32, device=q8.device)
    dk = torch.zeros(k8.shape, dtype=torch.float32, device=q8.device)
    dv = torch.zeros(v8.shape, dtype=torch.float32, device=q8.device)
    dlse_total = torch.zeros_like(lse) if dlse is None else dlse.float().clone()
    if z_loss_weight:
        dlse_total += z_loss_weight * torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    ds_do = dout_descale(dout, opts) if emulate_recipe else None
    for span in _spans(q8, k8, opts):
        n, qrows, krows, b = span
        pick_q = (lambda x: x[b]) if b is not None else (lambda x: x[qrows])
        pick_k = (lambda x: x[b]) if b is not None else (lambda x: x[krows])
        q8n, k8n, v8n = pick_q(q8), pick_k(k8), pick_k(v8)
        sq, sk = q8n.shape[0], k8n.shape[0]
        if sq == 0 or sk == 0:
            continue
        hq, hk = q8n.shape[1], k8n.shape[1]
        group = hq // hk
        lse_n = lse[b] if b is not None else lse[:, qrows]                  # [Hq, Sq]
        dlse_n = dlse_total[b] if b is not None else dlse_total[:, qrows]
        do_n = pick_q(dout).float()                                       # bf16 values, fp32
        o_n = pick_q(out).float()
        allowed = _allowed(opts, n, sq, sk, q8.device)
        sc = _scores(q8n, k8n, descale_q[n], descale_k[n], scale, opts, allowed)
        lse_safe = torch.where(torch.isfinite(lse_n), lse_n, torch.full_like(lse_n, math.inf))
        p = torch.exp(sc.capped - lse_safe[..., None])                    # [Hq, Sq, Sk], 0 masked
        v_rep = v8n.float().repeat_interleave(group, dim=1)
        dsq = descale_q[n].repeat_interleave(group)[:, None, None]
        dsk = descale_k[n].repeat_interleave(group)[:, None, None]
        dsv = descale_v[n].repeat_interleave(group)[:, None, None]
        if emulate_recipe and ablation != "dp_bf16":
            # dP = (dO8 . v8^T) * descale_dO * descale_v, dO8 = e4m3(dO / descale_dO)
            d_do = ds_do[n][:, None, None]                                 # [Hq, 1, 1]
            do8 = round_e4m3(do_n.transpose(0, 1) / d_do)                  # [Hq, Sq, Dv]
            dp = torch.einsum("hqd,khd->hqk", do8, v_rep) * (d_do * dsv)
            # Delta = rowsum(deq(dO8) * O): the same quantized dO as dP's, so that
            # sum_j dS_ij = 0 holds for the quantized dP as it does for the exact one
            delta = ((do8 * d_do) * o_n.transpose(0, 1)).sum(dim=-1)       # [Hq, Sq]
        else:
            dp = torch.einsum("qhd,khd->hqk", do_n, v_rep) * dsv
            delta = (do_n * o_n).sum(dim=-1).transpose(0, 1)              # [Hq, Sq] rowsum(dO * O)
        ds = p * (dp - delta[..., None] + dlse_n[..., None])
        derivative = _softcap_derivative(sc.raw, sc.capped, opts)
        if derivative is not None:
            ds = ds * torch.where(allowed, derivative, torch.zeros_like(derivative))
        if emulate_recipe:
            # bf16 products: p and dS rounded to bf16; q8, k8 are exact in bf16
            p_op = p.bfloat16().float()
            ds_op = ds.bfloat16().float()
            if ablation == "p_e4m3":
                p_op = round_e4m3(p * E4M3_MAX) / E4M3_MAX
            if ablation == "ds_e4m3":
                row_descale = descale_from_amax(ds.abs().amax(dim=-1, keepdim=True))
                ds_op = round_e4m3(ds / row_descale) * row_descale
            q_op, k_op = q8n.float(), k8n.float().repeat_interleave(group, dim=1)
            dq_factor, dk_factor = scale * dsk, scale * dsq
        else:
            p_op, ds_op = p, ds
            q_op = q8n.float() * dsq.transpose(0, 1)
            k_op = k8n.float().repeat_interleave(group, dim=1) * dsk.transpose(0, 1)
            dq_factor = dk_factor = torch.full_like(dsq, scale)
        dv_h = torch.einsum("hqk,qhd->khd", p_op, do_n)                   # dV = P^T dO (dO bf16)
        dk_h = torch.einsum("hqk,qhd->khd", ds_op, q_op) * dk_factor.transpose(0, 1)
        dq_n = torch.einsum("hqk,khd->qhd", ds_op, k_op) * dq_factor.transpose(0, 1)
        # GQA: the query heads of each group sum into their kv head (fp32, rounded once)
        dk_n = dk_h.reshape(sk, hk, group, -1).sum(dim=2)
        dv_n = dv_h.reshape(sk, hk, group, -1).sum(dim=2)
        if b is not None:
            dq[b], dk[b], dv[b] = dq_n, dk_n, dv_n
        else:
            dq[qrows], dk[krows], dv[krows] = dq_n, dk_n, dv_n
    return dq.to(grad_dtype), dk.to(grad_dtype), dv.to(grad_dtype)


class _EmulatedFp8Attention(torch.autograd.Function):
    """The recipe end to end in plain torch: quantize (flashgrad.fp8), emulated forward, and the
    emulated backward as this Function's backward (straight-through to the inputs)."""

    @staticmethod
    def forward(ctx, q, k, v, options):
        from .fp8 import quantize_per_head
        heads_k = k.shape[-2]
        cu_q, cu_k = options.get("cu_seqlens_q"), options.get("cu_seqlens_k")
        q8, dsq = quantize_per_head(q, heads_k, cu_q)
        k8, dsk = quantize_per_head(k, heads_k, cu_k)
        v8, dsv = quantize_per_head(v, heads_k, cu_k)
        out, lse = fp8_attention_reference(q8, k8, v8, dsq, dsk, dsv, **options)
        ctx.save_for_backward(q8, k8, v8, dsq, dsk, dsv, out, lse)
        ctx.options = options
        ctx.dtypes = (q.dtype, k.dtype, v.dtype)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q8, k8, v8, dsq, dsk, dsv, out, lse = ctx.saved_tensors
        dout = torch.zeros_like(out) if dout is None else dout.to(torch.bfloat16)
        grads = fp8_attention_reference_backward(dout, q8, k8, v8, dsq, dsk, dsv, out, lse, dlse,
                                                 **ctx.options)
        return tuple(g.to(t) for g, t in zip(grads, ctx.dtypes)) + (None,)


def fp8_attention_emulated(q, k, v, **options):
    """(out bf16, lse float32) of the emulated recipe on bf16 q, k, v, differentiable (the
    emulated backward): a stand-in for flash_attn_fp8_func on machines without the FP8 kernels,
    e.g. to predict training behaviour (flashgrad.demo.fp8_parity --emulate). options:
    AttentionOptions' fields."""
    return _EmulatedFp8Attention.apply(q, k, v, options)
