"""PyTorch attention ops: forward against the direct formula, torch.autograd.gradcheck in float64
for every mask, softcap method, GQA/MQA, varlen, lse and z-loss, and torch.library.opcheck on both
ops. Inputs are fresh random numbers on every run (seed printed on failure)."""

from __future__ import annotations

import pytest
import torch

import flashgrad
from flashgrad import flash_attn_func, flash_attn_varlen_func
from references import attention_padded, attention_varlen

F64 = torch.float64


def randn(rng, *shape, dtype=F64):
    return torch.randn(*shape, generator=rng, dtype=dtype).requires_grad_()


def qkv(rng, b=2, sq=5, sk=7, hq=4, hk=2, d=3, dv=5):
    return randn(rng, b, sq, hq, d), randn(rng, b, sk, hk, d), randn(rng, b, sk, hk, dv)


def gradcheck(fn, inputs):
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


# Padded layout: (flashgrad keyword arguments, reference arguments, lse finite on every row).
# softcap and scale are float32 in the core: values exact in float32 keep the float64 check tight.
PADDED_CASES = {
    "none": (dict(), dict(), True),
    "causal": (dict(causal=True), dict(mask="causal"), True),
    "window": (dict(window_size=(2, 1)), dict(mask="sliding_window", window=(2, 1)), True),
    "causal_window": (dict(causal=True, window_size=(2, -1)), dict(mask="sliding_window", window=(2, 0)), True),
    "left_unbounded_window": (dict(window_size=(-1, 1)), dict(mask="sliding_window", window=(-1, 1)), True),
    "softcap_tanh": (dict(softcap=0.75), dict(softcap=0.75, method="tanh"), True),
    "softcap_soft_sign": (dict(softcap=0.75, softcap_method="soft_sign"), dict(softcap=0.75, method="soft_sign"), True),
    "scale": (dict(softmax_scale=0.875), dict(scale=0.875), True),
}


@pytest.mark.parametrize("case", PADDED_CASES)
def test_padded_forward_and_gradcheck(rng, case):
    kwargs, ref_kwargs, lse_finite = PADDED_CASES[case]
    q, k, v = qkv(rng)
    out, lse = flash_attn_func(q, k, v, return_lse=True, **kwargs)
    ref_out, ref_lse = attention_padded(q, k, v, **ref_kwargs)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-10, atol=1e-12)
    assert lse_finite and torch.isfinite(lse).all()
    # Through both outputs: the gradient flows through lse too (dLSE).
    gradcheck(lambda q, k, v: flash_attn_func(q, k, v, return_lse=True, **kwargs), (q, k, v))


@pytest.mark.parametrize("sq,sk", [(7, 4), (4, 7), (6, 6)])
def test_causal_bottom_right_alignment(rng, sq, sk):
    # Sq > Sk leaves the first rows fully masked: out 0, lse -inf, zero gradient, no NaN.
    q, k, v = qkv(rng, sq=sq, sk=sk)
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    ref_out, ref_lse = attention_padded(q, k, v, mask="causal")
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-10, atol=1e-12)
    assert not torch.isnan(out).any()
    gradcheck(lambda q, k, v: flash_attn_func(q, k, v, causal=True), (q, k, v))
    if sq > sk:
        assert torch.isneginf(lse[:, :, : sq - sk]).all()
        dq, = torch.autograd.grad(flash_attn_func(q, k, v, causal=True).sum(), q)
        assert (dq[:, : sq - sk] == 0).all()


@pytest.mark.parametrize("hq,hk", [(4, 4), (4, 2), (4, 1)])
def test_gqa_mqa(rng, hq, hk):
    q, k, v = qkv(rng, hq=hq, hk=hk)
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    ref_out, _ = attention_padded(q, k, v, mask="causal")
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    gradcheck(lambda q, k, v: flash_attn_func(q, k, v, causal=True, return_lse=True), (q, k, v))


def test_prefix_lm(rng):
    q, k, v = qkv(rng, sq=6, sk=6)
    prefix = torch.tensor([2, 4], dtype=torch.int32)
    out = flash_attn_func(q, k, v, causal=True, prefix_lengths=prefix)
    ref_out, _ = attention_padded(q, k, v, mask="prefix_lm", prefix=prefix)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    gradcheck(lambda q, k, v: flash_attn_func(q, k, v, prefix_lengths=prefix, return_lse=True), (q, k, v))


def test_candidate_isolation(rng):
    q, k, v = qkv(rng, sq=7, sk=7)
    # history [h0, h1), candidates [c0, c1); row 6 of sequence 0 sees nothing.
    bounds = torch.tensor([[0, 3, 3, 6], [1, 4, 4, 7]], dtype=torch.int32)
    out, lse = flash_attn_func(q, k, v, candidate_bounds=bounds, return_lse=True)
    ref_out, ref_lse = attention_padded(q, k, v, mask="candidate_isolation", bounds=bounds)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-10, atol=1e-12)
    gradcheck(lambda q, k, v: flash_attn_func(q, k, v, candidate_bounds=bounds), (q, k, v))


VARLEN_CASES = {"none": dict(), "causal": dict(causal=True), "window": dict(window_size=(1, 1))}


@pytest.mark.parametrize("case", VARLEN_CASES)
def test_varlen_with_empty_sequence(rng, case):
    kwargs = VARLEN_CASES[case]
    # Sequence 1 is empty on both sides; sequence 2 has Sq != Sk.
    cu_q = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 4, 9], dtype=torch.int32)
    q, k, v = randn(rng, 7, 4, 3), randn(rng, 9, 2, 3), randn(rng, 9, 2, 4)
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 5, return_lse=True, **kwargs)
    mask = {"none": "none", "causal": "causal", "window": "sliding_window"}[case]
    ref_out, ref_lse = attention_varlen(q, k, v, cu_q, cu_k, mask=mask, window=kwargs.get("window_size", (-1, -1)))
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-10, atol=1e-12)
    gradcheck(lambda q, k, v: flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 5, return_lse=True, **kwargs),
              (q, k, v))


def test_varlen_matches_padded(rng):
    # Two sequences of the same lengths, packed: the same numbers as the padded call.
    q, k, v = qkv(rng, sq=5, sk=6)
    cu_q = torch.tensor([0, 5, 10], dtype=torch.int32)
    cu_k = torch.tensor([0, 6, 12], dtype=torch.int64)  # int64 is converted
    out = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, 5, 6, causal=True)
    torch.testing.assert_close(out.view(2, 5, 4, 5), flash_attn_func(q, k, v, causal=True), rtol=0, atol=0)


def test_z_loss_weight_adds_w_lse_to_dlse(rng):
    # z_loss_weight acts on gradients only: grads equal those of loss + (w/2) * sum(lse^2).
    q, k, v = qkv(rng)
    w = 0.375  # exact in float32 (the core takes a float)
    dout = torch.randn(2, 5, 4, 5, generator=rng, dtype=F64)
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True, z_loss_weight=w)
    out_plain = flash_attn_func(q, k, v, causal=True)
    torch.testing.assert_close(out, out_plain, rtol=0, atol=0)
    grads = torch.autograd.grad((out * dout).sum(), (q, k, v))
    out2, lse2 = flash_attn_func(q, k, v, causal=True, return_lse=True)
    expected = torch.autograd.grad((out2 * dout).sum() + 0.5 * w * (lse2 ** 2).sum(), (q, k, v))
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12)


def test_gradient_through_lse_only(rng):
    q, k, v = qkv(rng)
    gradcheck(lambda q, k, v: flash_attn_func(q, k, v, return_lse=True)[1], (q, k, v))


def test_deterministic_backward_is_bitwise_reproducible(rng):
    q, k, v = qkv(rng, b=2, sq=33, sk=41, hq=4, hk=1, d=8, dv=8)
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    dout = torch.randn(2, 33, 4, 8, generator=rng)
    runs = [torch.autograd.grad((flash_attn_func(q, k, v, causal=True, deterministic=True) * dout).sum(), (q, k, v))
            for _ in range(3)]
    for run in runs[1:]:
        for a, b in zip(runs[0], run):
            assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_dtypes(rng, dtype):
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in qkv(rng, d=8, dv=8))
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert out.dtype == dtype and lse.dtype == torch.float32
    ref_out, ref_lse = attention_padded(*(t.detach().double() for t in (q, k, v)), mask="causal")
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}[dtype]
    torch.testing.assert_close(out.double(), ref_out, rtol=tol, atol=tol)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert q.grad.dtype == dtype and torch.isfinite(q.grad.float()).all()


def test_return_attn_probs_gives_none(rng):
    q, k, v = qkv(rng)
    out, lse, probs = flash_attn_func(q, k, v, return_attn_probs=True)
    assert probs is None and lse.shape == (2, 4, 5)


def test_non_contiguous_inputs(rng):
    # Strided views (head-major storage, transposed last dims) are accepted.
    q, k, v = qkv(rng, d=4, dv=4)
    qt = q.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
    kt = k.detach().transpose(-1, -2).contiguous().transpose(-1, -2).requires_grad_()
    torch.testing.assert_close(flash_attn_func(qt, kt, v), flash_attn_func(q, k, v), rtol=0, atol=0)
    gradcheck(lambda q, k: flash_attn_func(q, k, v), (qt, kt))


# ---- torch.library.opcheck ------------------------------------------------------------------------


def _forward_args(q, k, v, mask="none", cu_q=None, cu_k=None, max_q=0, max_k=0, window=(-1, -1),
                  prefix=None, bounds=None, softcap=0.0, method="tanh"):
    return (q, k, v, cu_q, cu_k, max_q, max_k, None, mask, window[0], window[1], prefix, bounds,
            softcap, method, 0.0, False)


def _opcheck_cases(rng):
    q, k, v = qkv(rng)
    cu_q = torch.tensor([0, 2, 5], dtype=torch.int32)
    cu_k = torch.tensor([0, 3, 7], dtype=torch.int32)
    qv, kv, vv = randn(rng, 5, 4, 3), randn(rng, 7, 2, 3), randn(rng, 7, 2, 5)
    return {
        "causal": _forward_args(q, k, v, "causal"),
        "window_softcap": _forward_args(q, k, v, "sliding_window", window=(2, 1), softcap=0.5, method="soft_sign"),
        "varlen": _forward_args(qv, kv, vv, "causal", cu_q, cu_k, 3, 4),
    }


@pytest.mark.parametrize("case", ["causal", "window_softcap", "varlen"])
def test_opcheck_attention_forward(rng, case):
    args = _opcheck_cases(rng)[case]
    torch.library.opcheck(torch.ops.flashgrad.attention_forward.default, args)


@pytest.mark.parametrize("case", ["causal", "varlen"])
def test_opcheck_attention_backward(rng, case):
    args = _opcheck_cases(rng)[case]
    q, k, v = (t.detach() for t in args[:3])
    args = (q, k, v) + args[3:]
    out, lse = torch.ops.flashgrad.attention_forward(*args)
    dout = torch.randn(out.shape, generator=rng, dtype=F64)
    dlse = torch.randn(lse.shape, generator=rng, dtype=F64)
    bwd_args = (dout, dlse, q, k, v, out, lse) + args[3:15] + (0.1, False)
    torch.library.opcheck(torch.ops.flashgrad.attention_backward.default, bwd_args)


# ---- GPU: the same functions on CUDA tensors, against the CPU reference ------------------------


def _bound(name, x, x_ref, x_lowp):
    """docs/attention.md's rule: |X - X_ref32| <= 2 max|X_lowp - X_ref32| + rounding at that size.
    Rows with no allowed key (lse = -inf) must match exactly and are left out of the maxima."""
    x, x_ref, x_lowp = x.float(), x_ref.float(), x_lowp.float()
    empty = torch.isneginf(x_ref)
    assert torch.equal(torch.isneginf(x), empty), f"{name}: fully masked rows differ"
    x, x_ref, x_lowp = (t.masked_fill(empty, 0.0) for t in (x, x_ref, x_lowp))
    atol = 2 * (x_ref + 0.3 - 0.3 - x_ref).abs().max().item()
    err = (x - x_ref).abs().max().item()
    limit = 2 * (x_lowp - x_ref).abs().max().item() + atol
    assert err <= limit, f"{name}: max error {err:.3e} > {limit:.3e}"


def _loss(out, lse, dout, dlse):
    # Through out and lse (dLSE), with fully masked rows (lse = -inf) left out.
    return (out.float() * dout).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * dlse).sum()


def _check_gpu_against_cpu(rng, q, k, v, fn, lowp_fn, device="cuda"):
    """fn(q, k, v) -> (out, lse) on `device` vs the CPU reference in float32; lowp_fn is the plain
    torch formula run in the input precision on `device` (the yardstick of the rule)."""
    dout = torch.randn(*q.shape[:-1], v.shape[-1], generator=rng)
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if q.dim() == 4 else (q.shape[1], q.shape[0])
    dlse = torch.randn(lse_shape, generator=rng)

    def run(f, q, k, v, device):
        q, k, v = (t.to(device).requires_grad_() for t in (q, k, v))
        out, lse = f(q, k, v)
        grads = torch.autograd.grad(_loss(out, lse, dout.to(device), dlse.to(device)), (q, k, v))
        return [t.detach().cpu() for t in (out, lse, *grads)]

    gpu = run(fn, q, k, v, device)
    ref = run(fn, *(t.float() for t in (q, k, v)), "cpu")
    lowp = run(lowp_fn, q, k, v, device)
    for name, x, x_ref, x_lowp in zip(["out", "lse", "dq", "dk", "dv"], gpu, ref, lowp):
        _bound(name, x, x_ref, x_lowp)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_gpu_matches_cpu_reference(rng, dtype, causal, d):
    b, sq, sk, hq, hk = 2, 77, 129, 4, 2
    q, k, v = (torch.randn(b, s, h, d, generator=rng).to(dtype) for s, h in ((sq, hq), (sk, hk), (sk, hk)))
    _check_gpu_against_cpu(
        rng, q, k, v,
        lambda q, k, v: flash_attn_func(q, k, v, causal=causal, return_lse=True),
        lambda q, k, v: attention_padded(q, k, v, mask="causal" if causal else "none"))


# Each mask and softcap method on the GPU: (flashgrad kwargs, reference kwargs, kv heads, Sq, Sk).
GPU_FEATURES = {
    "window": (dict(window_size=(32, 8)), dict(mask="sliding_window", window=(32, 8)), 2, 97, 130),
    "causal_window": (dict(causal=True, window_size=(48, -1)), dict(mask="sliding_window", window=(48, 0)), 2, 97, 97),
    "softcap_tanh": (dict(causal=True, softcap=2.0), dict(mask="causal", softcap=2.0), 2, 97, 97),
    "softcap_soft_sign": (dict(softcap=2.0, softcap_method="soft_sign"), dict(softcap=2.0, method="soft_sign"), 2, 97, 97),
    "mqa_causal_sq_gt_sk": (dict(causal=True), dict(mask="causal"), 1, 130, 97),
    "prefix_lm": (dict(prefix_lengths=torch.tensor([20, 50], dtype=torch.int32)),
                  dict(mask="prefix_lm", prefix=torch.tensor([20, 50])), 2, 97, 97),
    "candidates": (dict(candidate_bounds=torch.tensor([[0, 40, 40, 90], [5, 60, 60, 97]], dtype=torch.int32)),
                   dict(mask="candidate_isolation", bounds=torch.tensor([[0, 40, 40, 90], [5, 60, 60, 97]])),
                   2, 97, 97),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_FEATURES)
def test_gpu_masks_and_softcap(rng, case):
    kwargs, ref_kwargs, hk, sq, sk = GPU_FEATURES[case]
    q, k, v = (torch.randn(2, s, h, 128, generator=rng).bfloat16() for s, h in ((sq, 4), (sk, hk), (sk, hk)))

    def fn(q, k, v):
        moved = {n: (t.to(q.device) if isinstance(t, torch.Tensor) else t) for n, t in kwargs.items()}
        return flash_attn_func(q, k, v, return_lse=True, **moved)

    _check_gpu_against_cpu(rng, q, k, v, fn, lambda q, k, v: attention_padded(q, k, v, **ref_kwargs))


@pytest.mark.gpu
def test_gpu_varlen(rng):
    cu_q = torch.tensor([0, 70, 70, 171], dtype=torch.int32)
    cu_k = torch.tensor([0, 90, 90, 190], dtype=torch.int32)
    q = torch.randn(171, 4, 64, generator=rng).bfloat16()
    k = torch.randn(190, 2, 64, generator=rng).bfloat16()
    v = torch.randn(190, 2, 64, generator=rng).bfloat16()

    def fn(q, k, v):
        return flash_attn_varlen_func(q, k, v, cu_q.to(q.device), cu_k.to(q.device), 101, 100, causal=True,
                                      return_lse=True)

    _check_gpu_against_cpu(rng, q, k, v, fn, lambda q, k, v: attention_varlen(q, k, v, cu_q, cu_k, mask="causal"))


@pytest.mark.gpu
def test_gpu_opcheck_and_stream():
    q = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch.library.opcheck(torch.ops.flashgrad.attention_forward.default, _forward_args(q, k, v, "causal"))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # runs on the current stream, not the default one
        out = flash_attn_func(q, k, v, causal=True)
    stream.synchronize()
    torch.testing.assert_close(out, flash_attn_func(q, k, v, causal=True), rtol=0, atol=0)


def test_build_info():
    assert set(flashgrad.build_info()) == {"cuda"}
