"""FP8 attention (docs/fp8.md) for PyTorch.

CPU: the quantizer (round trip, saturation, ties to even, amax == 0, GQA groups, varlen);
flash_attn_fp8_func / flash_attn_varlen_fp8_func on the CPU backend against the exact attention of
the dequantized inputs in float64 (the CPU backend computes exactly on the quantized inputs);
the recipe's emulation (exact mode against the float64 formulas, recipe mode's defining cases);
argument errors; opcheck of the e4m3 ops; torch.compile.

GPU (marked gpu): the CUDA FP8 kernels against the emulation by docs/attention.md's 2x rule,
max|X - X_ref32| <= r * max|X_emul - X_ref32| + atol (r = 2, 3 with softcap), for out, lse, dq,
dk, dv, where X_ref32 is float32 attention on the dequantized inputs; relative RMS errors printed.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

import flashgrad
from flashgrad import flash_attn_fp8_func, flash_attn_varlen_fp8_func
from flashgrad.fp8 import (E4M3_MAX, amax_per_head, dequantize_per_head, quantize_per_head,
                           sequence_of_token, to_e4m3)
from flashgrad.fp8_reference import fp8_attention_reference, fp8_attention_reference_backward
from references import attention_padded, attention_varlen

F64 = torch.float64
BF16 = torch.bfloat16


def randn(rng, *shape, dtype=BF16, scale=1.0):
    return (scale * torch.randn(*shape, generator=rng)).to(dtype)


def raises(kind, arg, fn, *args, **kwargs):
    with pytest.raises(kind, match=re.escape(f"argument '{arg}'")) as info:
        fn(*args, **kwargs)
    return str(info.value)


# ---- the quantizer -------------------------------------------------------------------------------


def test_e4m3_rounds_to_nearest_even_and_saturates():
    # Around 1 the e4m3 step is 1/8: 1.0625 ties to 1.0 (even), 1.1875 ties to 1.25 (even).
    x = torch.tensor([1.0625, 1.1875, 1.07, -1.0625, 448.0, 464.0, 1e6, -1e6, 0.0, 2.0 ** -10])
    expected = torch.tensor([1.0, 1.25, 1.125, -1.0, 448.0, 448.0, 448.0, -448.0, 0.0, 0.0])
    assert torch.equal(to_e4m3(x).float(), expected)
    assert torch.isnan(to_e4m3(torch.tensor([math.nan]))).all()


def test_quantize_round_trip_and_scale_per_group(rng):
    b, s, hq, hk, d = 2, 9, 6, 2, 16
    x = randn(rng, b, s, hq, d, scale=3.0)
    x8, descale = quantize_per_head(x, hk)
    assert x8.dtype == torch.float8_e4m3fn and x8.shape == x.shape
    assert descale.dtype == torch.float32 and descale.shape == (b, hk)
    # amax over the sequence and the query heads of each kv-head group: heads 3g, 3g+1, 3g+2
    for g in range(hk):
        amax = x[:, :, 3 * g:3 * g + 3].float().abs().amax(dim=(1, 2, 3))
        torch.testing.assert_close(descale[:, g], amax * (1 / E4M3_MAX), rtol=0, atol=0)
        # the largest entry of each group lands on 448
        assert torch.equal(x8[:, :, 3 * g:3 * g + 3].float().abs().amax(dim=(1, 2, 3)),
                           torch.full((b,), E4M3_MAX))
    back = dequantize_per_head(x8, descale)
    # rounding to 3 mantissa bits: at most half a step, 2^-4 relative, or half the smallest
    # subnormal (2^-10 of the scale) near zero
    bound = torch.maximum(x.float().abs() * 2.0 ** -4, 2.0 ** -10 * descale.amax()) * (1 + 1e-6)
    assert ((back - x.float()).abs() <= bound).all()
    assert (back - x.float()).abs().max() > 0  # it does quantize


def test_all_zero_block_gets_descale_one(rng):
    x = randn(rng, 2, 5, 2, 8)
    x[1, :, 1] = 0
    x8, descale = quantize_per_head(x, 2)
    assert descale[1, 1] == 1.0 and descale[0, 1] != 1.0
    assert (x8[1, :, 1].float() == 0).all()
    empty8, empty_descale = quantize_per_head(x[:, :0], 2)   # no tokens at all
    assert empty8.shape == (2, 0, 2, 8) and (empty_descale == 1).all()


def test_varlen_scales_per_sequence_with_empty_sequence(rng):
    cu = torch.tensor([0, 4, 4, 11], dtype=torch.int32)
    x = randn(rng, 11, 4, 8)
    assert sequence_of_token(cu, 11).tolist() == [0] * 4 + [2] * 7
    x8, descale = quantize_per_head(x, 2, cu)
    assert descale.shape == (3, 2) and (descale[1] == 1).all()
    for n, (start, end) in enumerate([(0, 4), (4, 4), (4, 11)]):
        if end == start:
            continue
        padded8, padded_descale = quantize_per_head(x[start:end][None], 2)
        assert torch.equal(descale[n], padded_descale[0])
        assert torch.equal(x8[start:end].float(), padded8[0].float())
    torch.testing.assert_close(amax_per_head(x, 2, cu)[2],
                               x[4:].float().abs().view(7, 2, 2, 8).amax(dim=(0, 2, 3)))


# ---- flash_attn_fp8_func on the CPU: exact attention of the quantized inputs --------------------


def _dequantized(q, k, v, cu_q=None, cu_k=None):
    hk = k.shape[-2]
    return [dequantize_per_head(*quantize_per_head(t, hk, cu), cu).double().requires_grad_()
            for t, cu in ((q, cu_q), (k, cu_k), (v, cu_k))]


def _delta_shift(out, ref_out, dout, varlen=False):
    """The backward takes Delta = rowsum(dO * O) from the stored bf16 O (as FlashAttention does);
    against the exact O that is the same as adding rowsum(dO * (O_exact - O_bf16)) to dLSE, which
    this returns in lse's layout so that the float64 reference can include it."""
    shift = (dout.double() * (ref_out.detach() - out.detach().double())).sum(-1)
    return shift.transpose(0, 1) if varlen else shift.transpose(1, 2)


def _assert_bf16_of(x, ref, name):
    """x (bf16) is ref (float64) rounded once: within half a bf16 step (2^-8 relative) plus the
    float32 arithmetic of the CPU backend."""
    err = (x.double() - ref).abs()
    bound = 2.0 ** -8 * ref.abs() + 1e-5 * ref.abs().max() + 1e-30
    assert (err <= bound).all(), f"{name}: worst excess {(err - bound).max().item():.3e}"


CPU_CASES = {
    "causal_gqa": (dict(causal=True), dict(mask="causal"), 4, 2, 13, 13),
    "full_sq_ne_sk": (dict(), dict(), 2, 2, 7, 12),
    "window_softcap_tanh": (dict(window_size=(3, 1), softcap=2.0), dict(mask="sliding_window", window=(3, 1), softcap=2.0), 4, 1, 11, 11),
    "soft_sign_scale": (dict(causal=True, softcap=1.5, softcap_method="soft_sign", softmax_scale=0.3),
                        dict(mask="causal", softcap=1.5, method="soft_sign", scale=0.3), 2, 1, 9, 9),
}


@pytest.mark.parametrize("case", CPU_CASES)
def test_cpu_forward_backward_is_exact_on_quantized_inputs(rng, case):
    kwargs, ref_kwargs, hq, hk, sq, sk = CPU_CASES[case]
    q, k, v = (randn(rng, 2, s, h, 16) for s, h in ((sq, hq), (sk, hk), (sk, hk)))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = flash_attn_fp8_func(q, k, v, return_lse=True, **kwargs)
    assert out.dtype == BF16 and lse.dtype == torch.float32
    dout, dlse = randn(rng, *out.shape), torch.randn(lse.shape, generator=rng)
    grads = torch.autograd.grad((out.float() * dout.float()).sum() + (lse * dlse).sum(), (q, k, v))

    qd, kd, vd = _dequantized(q.detach(), k.detach(), v.detach())
    ref_out, ref_lse = attention_padded(qd, kd, vd, **ref_kwargs)
    ref_dlse = dlse.double() + _delta_shift(out, ref_out, dout)
    ref_grads = torch.autograd.grad((ref_out * dout.double()).sum() + (ref_lse * ref_dlse).sum(),
                                    (qd, kd, vd))
    _assert_bf16_of(out, ref_out, "out")
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=1e-6)
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert g.dtype == BF16
        _assert_bf16_of(g, r, name)


def test_cpu_varlen_with_empty_sequence_and_z_loss(rng):
    cu_q = torch.tensor([0, 5, 5, 12], dtype=torch.int32)
    cu_k = torch.tensor([0, 6, 9, 17], dtype=torch.int32)
    q, k, v = randn(rng, 12, 4, 16), randn(rng, 17, 2, 16), randn(rng, 17, 2, 16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    w = 0.25
    out, lse = flash_attn_varlen_fp8_func(q, k, v, cu_q, cu_k, 7, 8, causal=True, return_lse=True,
                                          z_loss_weight=w)
    dout = randn(rng, *out.shape)
    grads = torch.autograd.grad((out.float() * dout.float()).sum(), (q, k, v))
    qd, kd, vd = _dequantized(q.detach(), k.detach(), v.detach(), cu_q, cu_k)
    ref_out, ref_lse = attention_varlen(qd, kd, vd, cu_q, cu_k, mask="causal")
    # z-loss: the backward adds w * lse to dLSE
    ref_dlse = w * ref_lse.detach() + _delta_shift(out, ref_out, dout, varlen=True)
    objective = (ref_out * dout.double()).sum() + (ref_dlse * ref_lse).sum()
    ref_grads = torch.autograd.grad(objective, (qd, kd, vd))
    _assert_bf16_of(out, ref_out, "out")
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=1e-6)
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        _assert_bf16_of(g, r, name)


def test_float16_and_float32_inputs_keep_their_dtype(rng):
    for dtype in (torch.float16, torch.float32):
        q, k, v = (randn(rng, 1, 6, 2, 16, dtype=dtype).requires_grad_() for _ in range(3))
        out = flash_attn_fp8_func(q, k, v, causal=True)
        assert out.dtype == dtype
        out.float().sum().backward()
        assert q.grad.dtype == dtype and torch.isfinite(q.grad).all()


def test_return_attn_probs_and_lse_only_gradient(rng):
    q, k, v = (randn(rng, 1, 6, 2, 16).requires_grad_() for _ in range(3))
    out, lse, probs = flash_attn_fp8_func(q, k, v, causal=True, return_attn_probs=True)
    assert probs is None
    lse.sum().backward()   # out unused: dO = 0
    assert q.grad is not None and torch.isfinite(q.grad).all()
    assert v.grad.abs().max() == 0  # dv = P^T dO = 0


# ---- the emulation --------------------------------------------------------------------------------


EMULATION_CASES = {
    "causal_gqa": (dict(causal=True), dict(mask="causal"), 4, 2, 10, 13),
    "window": (dict(window_size=(2, 3)), dict(mask="sliding_window", window=(2, 3)), 2, 2, 9, 9),
    "tanh_softcap": (dict(causal=True, softcap=1.0), dict(mask="causal", softcap=1.0), 2, 1, 8, 8),
    "soft_sign": (dict(softcap=1.0, softcap_method="soft_sign"), dict(softcap=1.0, method="soft_sign"), 2, 1, 8, 8),
    "prefix_lm": (dict(prefix_lengths=torch.tensor([3, 6])), dict(mask="prefix_lm", prefix=torch.tensor([3, 6])), 2, 2, 9, 9),
    "candidates": (dict(candidate_bounds=torch.tensor([[0, 4, 4, 8], [1, 5, 5, 9]])),
                   dict(mask="candidate_isolation", bounds=torch.tensor([[0, 4, 4, 8], [1, 5, 5, 9]])), 2, 2, 9, 9),
}


def _quantized(rng, b, sq, sk, hq, hk, d=16):
    q, k, v = randn(rng, b, sq, hq, d), randn(rng, b, sk, hk, d), randn(rng, b, sk, hk, d)
    return [t for x in (q, k, v) for t in quantize_per_head(x, hk)]


@pytest.mark.parametrize("case", EMULATION_CASES)
def test_emulation_exact_mode_is_the_attention_of_dequantized_inputs(rng, case):
    """emulate_recipe=False (X_ref32 of the GPU tests): the float64 formulas, to float32 rounding."""
    kwargs, ref_kwargs, hq, hk, sq, sk = EMULATION_CASES[case]
    q8, dsq, k8, dsk, v8, dsv = _quantized(rng, 2, sq, sk, hq, hk)
    out, lse = fp8_attention_reference(q8, k8, v8, dsq, dsk, dsv, emulate_recipe=False, **kwargs)
    dout, dlse = torch.randn(out.shape, generator=rng), torch.randn(lse.shape, generator=rng)
    grads = fp8_attention_reference_backward(dout, q8, k8, v8, dsq, dsk, dsv, out, lse, dlse,
                                             emulate_recipe=False, **kwargs)
    qd, kd, vd = (dequantize_per_head(x, s).double().requires_grad_() for x, s in ((q8, dsq), (k8, dsk), (v8, dsv)))
    ref_out, ref_lse = attention_padded(qd, kd, vd, **ref_kwargs)
    finite = torch.isfinite(ref_lse)
    ref_grads = torch.autograd.grad((ref_out * dout.double()).sum()
                                    + (torch.where(finite, ref_lse, 0.0) * dlse.double()).sum(), (qd, kd, vd))
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse.double()[finite], ref_lse[finite], rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-4 * r.abs().max().item())


def test_emulation_varlen_matches_padded(rng):
    cu = torch.tensor([0, 7, 7, 16], dtype=torch.int32)
    q, k, v = randn(rng, 16, 4, 16), randn(rng, 16, 2, 16), randn(rng, 16, 2, 16)
    q8, dsq = quantize_per_head(q, 2, cu)
    k8, dsk = quantize_per_head(k, 2, cu)
    v8, dsv = quantize_per_head(v, 2, cu)
    opts = dict(causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu)
    out, lse = fp8_attention_reference(q8, k8, v8, dsq, dsk, dsv, **opts)
    dout = randn(rng, *out.shape)
    grads = fp8_attention_reference_backward(dout, q8, k8, v8, dsq, dsk, dsv, out, lse, **opts)
    for n, (a, e) in enumerate([(0, 7), (7, 16)]):
        seq = 0 if n == 0 else 2
        po, pl = fp8_attention_reference(q8[a:e][None], k8[a:e][None], v8[a:e][None], dsq[seq:seq + 1],
                                         dsk[seq:seq + 1], dsv[seq:seq + 1], causal=True)
        pg = fp8_attention_reference_backward(dout[a:e][None], q8[a:e][None], k8[a:e][None], v8[a:e][None],
                                              dsq[seq:seq + 1], dsk[seq:seq + 1], dsv[seq:seq + 1], po, pl,
                                              causal=True)
        assert torch.equal(out[a:e], po[0]) and torch.equal(lse[:, a:e], pl[0])
        for g, p in zip(grads, pg):
            assert torch.equal(g[a:e], p[0])


def test_emulation_quantizes_p_relative_to_448(rng):
    """Row 0 of a causal call sees key 0 alone: p~ = 1 -> e4m3(448) = 448 exactly, so out is v
    dequantized, rounded once to bf16; later rows carry P's e4m3 rounding."""
    q8, dsq, k8, dsk, v8, dsv = _quantized(rng, 1, 12, 12, 2, 2)
    out, lse = fp8_attention_reference(q8, k8, v8, dsq, dsk, dsv, causal=True)
    exact, _ = fp8_attention_reference(q8, k8, v8, dsq, dsk, dsv, causal=True, emulate_recipe=False)
    v_deq = dequantize_per_head(v8, dsv)
    assert torch.equal(out[0, 0], v_deq[0, 0].to(BF16))
    rel = ((out.float() - exact) ** 2).mean().sqrt() / (exact ** 2).mean().sqrt()
    assert 1e-3 < rel < 0.05, rel   # e4m3 P: a few percent, not zero, not wrong


def test_emulation_backward_tracks_exact_backward(rng):
    q8, dsq, k8, dsk, v8, dsv = _quantized(rng, 1, 64, 64, 4, 2, d=32)
    out, lse = fp8_attention_reference(q8, k8, v8, dsq, dsk, dsv, causal=True)
    dout = randn(rng, *out.shape)
    grads = fp8_attention_reference_backward(dout, q8, k8, v8, dsq, dsk, dsv, out, lse, causal=True)
    exact_out, exact_lse = fp8_attention_reference(q8, k8, v8, dsq, dsk, dsv, causal=True, emulate_recipe=False)
    exact = fp8_attention_reference_backward(dout, q8, k8, v8, dsq, dsk, dsv, exact_out, exact_lse,
                                             causal=True, emulate_recipe=False)
    for name, g, e in zip(("dq", "dk", "dv"), grads, exact):
        rel = ((g.float() - e) ** 2).mean().sqrt() / (e ** 2).mean().sqrt()
        assert 1e-4 < rel < 0.08, (name, rel)


# ---- errors -----------------------------------------------------------------------------------------


def test_errors_name_the_argument(rng):
    q, k, v = randn(rng, 1, 5, 4, 16), randn(rng, 1, 6, 2, 16), randn(rng, 1, 6, 2, 16)
    assert "quantizes it inside" in raises(ValueError, "q", flash_attn_fp8_func, q.to(torch.float8_e4m3fn), k, v)
    raises(ValueError, "k", flash_attn_fp8_func, q, k.int(), v)
    raises(ValueError, "v", flash_attn_fp8_func, q, k, v.half())
    assert "rank 4" in raises(ValueError, "q", flash_attn_fp8_func, q[0], k, v)
    assert "multiple" in raises(ValueError, "k", flash_attn_fp8_func, q, randn(rng, 1, 6, 3, 16), v)
    raises(ValueError, "v", flash_attn_fp8_func, q, k, randn(rng, 1, 6, 1, 16))
    raises(TypeError, "q", flash_attn_fp8_func, q.numpy() if False else [1.0], k, v)
    raises(NotImplementedError, "dropout_p", flash_attn_fp8_func, q, k, v, dropout_p=0.1)
    raises(ValueError, "softcap", flash_attn_fp8_func, q, k, v, softcap=-1.0)
    raises(ValueError, "window_size", flash_attn_fp8_func, q, k, v, window_size=3)
    # the core's checks run after quantization and still name the argument
    raises(ValueError, "k", flash_attn_fp8_func, q, randn(rng, 1, 6, 2, 8), v)
    cu = torch.tensor([0, 5], dtype=torch.int32)
    raises(ValueError, "cu_seqlens_q", flash_attn_varlen_fp8_func, q[0], k[0], v[0], None, cu, 5, 6)
    raises(ValueError, "cu_seqlens_k", flash_attn_varlen_fp8_func, q[0], k[0], v[0], cu,
           torch.tensor([0, 5], dtype=torch.int32), 5, 6)   # k has 6 tokens
    raises(ValueError, "cu_seqlens_q", flash_attn_varlen_fp8_func, q[0], k[0], v[0], cu.float(), cu, 5, 6)
    raises(NotImplementedError, "block_table", flash_attn_varlen_fp8_func, q[0], k[0], v[0], cu, cu, 5, 6,
           block_table=cu)


def test_low_level_op_requires_descales_for_e4m3(rng):
    q8 = randn(rng, 1, 4, 2, 16).to(torch.float8_e4m3fn)
    args = (q8, q8, q8, None, None, 0, 0, None, "causal", -1, -1, None, None, 0.0, "tanh", 0.0, False)
    raises(ValueError, "descale_q", torch.ops.flashgrad.attention_forward, *args)
    ones = torch.ones(1, 2)
    raises(ValueError, "descale_v", torch.ops.flashgrad.attention_forward, *args, descale_q=ones,
           descale_k=ones, descale_v=torch.ones(2, 2))
    bf = q8.to(BF16)
    raises(ValueError, "descale_q", torch.ops.flashgrad.attention_forward, bf, bf, bf, *args[3:],
           descale_q=ones)


# ---- opcheck and torch.compile -----------------------------------------------------------------------


def _e4m3_args(rng, causal=True):
    q8, dsq, k8, dsk, v8, dsv = _quantized(rng, 1, 5, 7, 4, 2)
    fwd = (q8, k8, v8, None, None, 0, 0, None, "causal" if causal else "none", -1, -1, None, None, 0.0,
           "tanh", 0.0, False, dsq, dsk, dsv)
    return fwd


def test_opcheck_e4m3_forward_and_backward(rng):
    fwd = _e4m3_args(rng)
    torch.library.opcheck(torch.ops.flashgrad.attention_forward.default, fwd,
                          test_utils=("test_faketensor", "test_aot_dispatch_static"))
    out, lse = torch.ops.flashgrad.attention_forward(*fwd)
    assert out.dtype == BF16
    dout = randn(rng, *out.shape)
    bwd = (dout, torch.randn(lse.shape, generator=rng), *fwd[:3], out, lse, *fwd[3:15], 0.0, False, *fwd[17:])
    torch.library.opcheck(torch.ops.flashgrad.attention_backward.default, bwd,
                          test_utils=("test_faketensor", "test_aot_dispatch_static"))
    dq, dk, dv = torch.ops.flashgrad.attention_backward(*bwd)
    assert dq.dtype == dk.dtype == dv.dtype == BF16


def test_torch_compile_matches_eager(rng):
    """fullgraph: the quantizer is plain torch, the autograd Function and the ops trace through;
    the compiled call quantizes to the same bits, so the results agree to summation order."""
    torch._dynamo.reset()

    def loss_fn(q, k, v, w):
        out, lse = flash_attn_fp8_func(q, k, v, causal=True, softcap=3.0, return_lse=True)
        return (out.float() * w).sum() + 1e-2 * lse.square().sum()

    q, k, v = (randn(rng, 2, 9, h, 16).requires_grad_() for h in (4, 2, 2))
    w = torch.randn(2, 9, 4, 16, generator=rng)
    eager = loss_fn(q, k, v, w)
    eager_grads = torch.autograd.grad(eager, (q, k, v))
    compiled = torch.compile(loss_fn, fullgraph=True)
    loss = compiled(q, k, v, w)
    grads = torch.autograd.grad(loss, (q, k, v))
    # The ops run on the same quantized bits; what may differ is the compiled graph's summation
    # order in the loss and in dLSE (1 ulp of fp32), which can move a bf16 gradient by one step.
    torch.testing.assert_close(loss, eager, rtol=1e-4, atol=0)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, rtol=2 ** -7, atol=2 ** -7 * e.abs().max().item())


def test_exported_by_the_package():
    assert "flash_attn_fp8_func" in dir(flashgrad) and "flash_attn_varlen_fp8_func" in dir(flashgrad)


# ---- GPU: the CUDA FP8 kernels against the emulation (docs/attention.md's 2x rule) ----------------

_REFUSAL = {}


def _cuda_refusal():
    """None when the CUDA backend runs e4m3 attention, else its NotImplementedError message
    (a build or GPU without the FP8 kernels must refuse clearly, never fall back)."""
    if "message" not in _REFUSAL:
        x = torch.randn(1, 16, 1, 64, device="cuda", dtype=BF16)
        try:
            flash_attn_fp8_func(x, x, x)
            _REFUSAL["message"] = None
        except NotImplementedError as error:
            _REFUSAL["message"] = str(error)
    return _REFUSAL["message"]


@pytest.fixture
def fp8_cuda():
    refusal = _cuda_refusal()
    if refusal is not None:
        pytest.skip(f"the CUDA backend refuses e4m3 attention (no FP8 kernels in this build): {refusal}")
    matmul_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False   # the emulation's float32 products stay float32
    yield
    torch.backends.cuda.matmul.allow_tf32 = matmul_tf32


@pytest.mark.gpu
def test_gpu_refuses_clearly_or_runs():
    refusal = _cuda_refusal()
    if refusal is not None:
        assert "float8_e4m3fn" in refusal and "argument 'q'" in refusal, refusal
        print(f"fp8 CUDA kernels absent: {refusal}")


def _rel_rms(x, ref):
    x, ref = x.float(), ref.float()
    keep = torch.isfinite(ref)
    return float(((x - ref)[keep] ** 2).mean().sqrt() / (ref[keep] ** 2).mean().sqrt().clamp_min(1e-30))


def _within(name, x, x_ref, x_emul, ratio, dtype):
    """max|X - X_ref32| <= ratio * max|X_emul - X_ref32| + atol; atol = 2 * the rounding of X's
    dtype at X_ref32's magnitude. Rows without keys (lse -inf) must agree exactly."""
    x, x_ref, x_emul = x.float(), x_ref.float(), x_emul.float()
    empty = torch.isneginf(x_ref)
    assert torch.equal(torch.isneginf(x), empty), f"{name}: fully masked rows differ"
    x, x_ref, x_emul = (t.masked_fill(empty, 0.0) for t in (x, x_ref, x_emul))
    assert torch.isfinite(x).all(), f"{name}: non-finite values"
    atol = 2 * ((x_ref.to(dtype) + 0.3 - 0.3).float() - x_ref).abs().max().item() if dtype != torch.float32 \
        else 2 * (x_ref + 0.3 - 0.3 - x_ref).abs().max().item()
    err = (x - x_ref).abs().max().item()
    limit = ratio * (x_emul - x_ref).abs().max().item() + atol
    assert err <= limit, f"{name}: max error {err:.3e} > {limit:.3e} (emulation {(x_emul - x_ref).abs().max().item():.3e})"


def _check_against_emulation(rng, label, q, k, v, kwargs, varlen=None, device="cuda"):
    """q, k, v bf16 (CPU); kwargs: flash_attn_fp8_func's options; varlen: (cu_q, cu_k, max_q, max_k)."""
    q, k, v = (t.to(device).requires_grad_() for t in (q, k, v))
    moved = {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in kwargs.items()}
    if varlen is None:
        out, lse = flash_attn_fp8_func(q, k, v, return_lse=True, **moved)
        cu_q = cu_k = None
    else:
        cu_q, cu_k, max_q, max_k = (t.to(device) if isinstance(t, torch.Tensor) else t for t in varlen)
        out, lse = flash_attn_varlen_fp8_func(q, k, v, cu_q, cu_k, max_q, max_k, return_lse=True, **moved)
    dout = torch.randn(out.shape, generator=rng).to(BF16).to(device)
    dlse = torch.randn(lse.shape, generator=rng).to(device)
    finite = torch.isfinite(lse)
    loss = (out.float() * dout.float()).sum() + (torch.where(finite, lse, 0.0) * dlse).sum()
    grads = torch.autograd.grad(loss, (q, k, v))

    # The same quantized inputs (the quantizer is deterministic plain torch).
    hk = k.shape[-2]
    q8, dsq = quantize_per_head(q.detach(), hk, cu_q)
    k8, dsk = quantize_per_head(k.detach(), hk, cu_k)
    v8, dsv = quantize_per_head(v.detach(), hk, cu_k)
    opts = {n: t for n, t in moved.items() if n != "deterministic"}
    opts.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    dlse_used = torch.where(finite, dlse, 0.0)
    qkv8 = (q8, k8, v8, dsq, dsk, dsv)
    emul_out, emul_lse = fp8_attention_reference(*qkv8, **opts)
    emul_grads = fp8_attention_reference_backward(dout, *qkv8, emul_out, emul_lse, dlse_used, **opts)
    ref_out, ref_lse = fp8_attention_reference(*qkv8, emulate_recipe=False, **opts)
    ref_grads = fp8_attention_reference_backward(dout, *qkv8, ref_out, ref_lse, dlse_used,
                                                 emulate_recipe=False, **opts)
    _, lse_yardstick = fp8_attention_reference(*qkv8, scores_bf16=True, **opts)

    ratio = 3 if kwargs.get("softcap", 0.0) > 0 else 2
    names = ("out", "lse", "dq", "dk", "dv")
    kernel = (out, lse, *grads)
    emulated = (emul_out, lse_yardstick, *emul_grads)
    exact = (ref_out, ref_lse, *ref_grads)
    print(f"fp8 rel-rms vs fp32 [{label}] " + "  ".join(
        f"{n} {_rel_rms(x, r):.2e} (emul {_rel_rms(e, r):.2e})"
        for n, x, e, r in zip(names, kernel, (emul_out, emul_lse, *emul_grads), exact)))
    for n, x, e, r in zip(names, kernel, emulated, exact):
        _within(n, x.detach(), r, e, ratio, torch.float32 if n == "lse" else BF16)


@pytest.mark.parametrize("case", ["causal_window", "varlen_softcap"])
def test_the_gpu_check_passes_the_cpu_backend(rng, case):
    """The GPU tests' harness on the CPU backend (exact attention of the quantized inputs: its
    error is the bf16 rounding of the outputs, well inside the rule), so the harness itself runs
    on every machine."""
    if case == "causal_window":
        q, k, v = (randn(rng, 2, s, h, 32) for s, h in ((13, 4), (17, 2), (17, 2)))
        _check_against_emulation(rng, case, q, k, v, dict(causal=True, window_size=(5, -1)), device="cpu")
    else:
        cu = torch.tensor([0, 9, 9, 20], dtype=torch.int32)
        q, k, v = randn(rng, 20, 2, 32), randn(rng, 20, 1, 32), randn(rng, 20, 1, 32)
        _check_against_emulation(rng, case, q, k, v, dict(causal=True, softcap=2.0), varlen=(cu, cu, 11, 11),
                                 device="cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_gpu_fp8_matches_emulation(rng, fp8_cuda, causal, d):
    b, sq, sk, hq, hk = 2, 77, 129, 4, 2   # odd lengths, Sq != Sk (bottom-right causal), GQA
    q, k, v = (randn(rng, b, s, h, d) for s, h in ((sq, hq), (sk, hk), (sk, hk)))
    _check_against_emulation(rng, f"d{d} {'causal' if causal else 'full'}", q, k, v, dict(causal=causal))


GPU_FP8_FEATURES = {
    "softcap_tanh": (dict(causal=True, softcap=2.0), 2, 97, 97),
    "softcap_soft_sign": (dict(softcap=2.0, softcap_method="soft_sign"), 2, 97, 97),
    "window": (dict(window_size=(32, 8)), 2, 97, 130),
    "mqa_causal_sq_gt_sk": (dict(causal=True), 1, 130, 97),
    "prefix_lm": (dict(prefix_lengths=torch.tensor([20, 50], dtype=torch.int32)), 2, 97, 97),
    "candidates": (dict(candidate_bounds=torch.tensor([[0, 40, 40, 90], [5, 60, 60, 97]], dtype=torch.int32)), 2, 97, 97),
    "z_loss": (dict(causal=True, z_loss_weight=0.1), 2, 97, 97),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_FP8_FEATURES)
def test_gpu_fp8_features(rng, fp8_cuda, case):
    kwargs, hk, sq, sk = GPU_FP8_FEATURES[case]
    q, k, v = (randn(rng, 2, s, h, 128) for s, h in ((sq, 4), (sk, hk), (sk, hk)))
    if "z_loss_weight" in kwargs:
        opts = dict(kwargs)
        w = opts.pop("z_loss_weight")
        # z_loss_weight is the kernel's: the emulation adds w * lse to dLSE itself
        _check_z_loss(rng, q, k, v, opts, w)
        return
    _check_against_emulation(rng, case, q, k, v, kwargs)


def _check_z_loss(rng, q, k, v, opts, w):
    """The backward with z_loss_weight equals the backward with dLSE = w * lse: dk, dv bitwise
    (each has one owner per key block), dq to its fp32 atomic accumulation order."""
    q, k, v = (t.cuda().requires_grad_() for t in (q, k, v))
    opts = {n: (t.cuda() if isinstance(t, torch.Tensor) else t) for n, t in opts.items()}
    out, lse = flash_attn_fp8_func(q, k, v, return_lse=True, z_loss_weight=w, **opts)
    dout = torch.randn(out.shape, generator=rng).to(BF16).cuda()
    with_weight = torch.autograd.grad((out.float() * dout.float()).sum(), (q, k, v))
    out2, lse2 = flash_attn_fp8_func(q, k, v, return_lse=True, **opts)
    with_dlse = torch.autograd.grad((out2.float() * dout.float()).sum() + (w * lse2.detach() * lse2).sum(),
                                    (q, k, v))
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    torch.testing.assert_close(with_weight[0], with_dlse[0], rtol=2 ** -7, atol=1e-3 * with_dlse[0].abs().max().item())
    for a, b in zip(with_weight[1:], with_dlse[1:]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.gpu
def test_gpu_fp8_deterministic_backward_is_bitwise_reproducible(rng, fp8_cuda):
    q, k, v = (randn(rng, 2, 300, h, 128).cuda().requires_grad_() for h in (8, 2, 2))
    out = flash_attn_fp8_func(q, k, v, causal=True, deterministic=True)
    dout = torch.randn(out.shape, generator=rng).to(BF16).cuda()
    first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    for _ in range(3):
        again = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, b), f"{name}: the deterministic backward differs between runs"


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_fp8_varlen(rng, fp8_cuda, d):
    cu_q = torch.tensor([0, 70, 70, 171], dtype=torch.int32)   # an empty sequence in the middle
    cu_k = torch.tensor([0, 90, 90, 190], dtype=torch.int32)
    q, k, v = randn(rng, 171, 4, d), randn(rng, 190, 2, d), randn(rng, 190, 2, d)
    _check_against_emulation(rng, f"varlen d{d}", q, k, v, dict(causal=True), varlen=(cu_q, cu_k, 101, 100))


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_fp8_reported_shape(rng, fp8_cuda, d):
    """docs/fp8.md's shape: B1 H4 S1024 causal; prints the relative RMS errors."""
    q, k, v = (randn(rng, 1, 1024, 4, d) for _ in range(3))
    _check_against_emulation(rng, f"B1 H4 S1024 d{d} causal", q, k, v, dict(causal=True))


def test_training_parity_script_runs_on_the_cpu(tmp_path):
    """python -m flashgrad.demo.fp8_parity, a few steps on the CPU backend (the H200 runs the
    real 300 steps): both runs train, the files are written, the verdict is computed."""
    import json

    from flashgrad.demo.fp8_parity import main
    rc = main(["--device", "cpu", "--steps", "3", "--batch-size", "2", "--seq-len", "32", "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "fp8_parity.json").read_text())
    assert rc == (0 if summary["passed"] else 1)
    assert (tmp_path / "fp8_parity.csv").read_text().splitlines()[0] == "step,loss_bf16,loss_fp8"
    assert len((tmp_path / "fp8_parity.csv").read_text().splitlines()) == 4
    assert math.isfinite(summary["fp8_final_train_loss"]) and math.isfinite(summary["bf16_held_out_loss"])


def test_demo_turns_a_kernel_refusal_into_its_message():
    """python -m flashgrad.demo --fp8 on a CUDA build without FP8 kernels: the op's
    NotImplementedError becomes the demo's 'not available' message (exit status 2)."""
    from flashgrad.demo.kernels import KernelsUnavailable, _require_fp8_kernels

    def refusing(q, k, v, **kwargs):
        raise NotImplementedError("flashgrad: attention_forward: argument 'q': no e4m3 here")

    with pytest.raises(KernelsUnavailable, match="fp8 attention is not available in this build of flashgrad "
                                                 r"\(its CUDA backend refuses e4m3 inputs: .*no e4m3 here"):
        _require_fp8_kernels(refusing, torch.device("cpu"))
    _require_fp8_kernels(flash_attn_fp8_func, torch.device("cpu"))   # the CPU backend takes e4m3
