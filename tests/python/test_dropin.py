"""Drop-in: each function called exactly as FlashAttention's and fla's documentation show (only
the device and the sizes changed: CPU, small), checked against the direct formulas, with a
backward. `rearrange(x, 'b t ... -> 1 (b t) ...')` from the fla examples is written as
x.flatten(0, 1)[None] (einops is not a dependency)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import flashgrad
from references import attention_padded, attention_varlen, delta_rule

device = "cpu"


def test_flash_attn_readme_calls():
    from flashgrad import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_func

    batch_size, seqlen, nheads, headdim, nheads_k = 2, 33, 4, 16, 2
    q = torch.randn(batch_size, seqlen, nheads, headdim, device=device, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(batch_size, seqlen, nheads_k, headdim, device=device, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(batch_size, seqlen, nheads_k, headdim, device=device, dtype=torch.bfloat16, requires_grad=True)

    # FlashAttention 2 README: "flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
    # window_size=(-1, -1), alibi_slopes=None, deterministic=False)"
    out = flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                          alibi_slopes=None, deterministic=False)
    ref, _ = attention_padded(*(t.detach().double() for t in (q, k, v)))
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)
    out.float().sum().backward()

    # Causal, sliding window, softcap (Gemma 2), as in the README's feature list.
    for kwargs, ref_kwargs in ((dict(causal=True), dict(mask="causal")),
                               (dict(window_size=(8, 0)), dict(mask="sliding_window", window=(8, 0))),
                               (dict(causal=True, softcap=30.0), dict(mask="causal", softcap=30.0))):
        out = flash_attn_func(q, k, v, **kwargs)
        ref, _ = attention_padded(*(t.detach().double() for t in (q, k, v)), **ref_kwargs)
        torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)

    # FlashAttention 2's tests: out, lse, S_dmask = flash_attn_func(..., return_attn_probs=True)
    out, lse, S_dmask = flash_attn_func(q, k, v, 0.0, causal=True, return_attn_probs=True)
    assert S_dmask is None and lse.shape == (batch_size, nheads, seqlen)

    # Packed layouts.
    qkv = torch.randn(batch_size, seqlen, 3, nheads, headdim, dtype=torch.bfloat16, requires_grad=True)
    out = flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=True)
    ref, _ = attention_padded(*(t.detach().double() for t in qkv.unbind(2)), mask="causal")
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)
    out.float().sum().backward()
    assert qkv.grad.shape == qkv.shape
    kv = torch.stack([k.detach(), v.detach()], dim=2)
    torch.testing.assert_close(flash_attn_kvpacked_func(q, kv, causal=True), flash_attn_func(q, k, v, causal=True))

    # Varlen, as FlashAttention's varlen interface: cu_seqlens int32, max_seqlen ints.
    lengths = [5, 17, 11]
    cu_seqlens = torch.tensor([0, 5, 22, 33], device=device, dtype=torch.int32)
    qv = torch.randn(sum(lengths), nheads, headdim, dtype=torch.bfloat16, requires_grad=True)
    kvv = torch.randn(sum(lengths), nheads_k, headdim, dtype=torch.bfloat16)
    out = flash_attn_varlen_func(qv, kvv, kvv, cu_seqlens, cu_seqlens, max(lengths), max(lengths),
                                 dropout_p=0.0, softmax_scale=None, causal=True)
    ref, _ = attention_varlen(qv.detach().double(), kvv.double(), kvv.double(), cu_seqlens, cu_seqlens,
                              mask="causal")
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)
    out.float().sum().backward()


def _check(o, ht, x, **ref_kwargs):
    ref_o, ref_ht = delta_rule(*(None if t is None else t.detach().double() for t in x), **ref_kwargs)
    torch.testing.assert_close(o.double(), ref_o, rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(ht.double(), ref_ht, rtol=5e-2, atol=5e-2)


def test_chunk_gated_delta_rule_docstring():
    from flashgrad import chunk_gated_delta_rule

    # inputs with equal lengths
    B, T, H, K, V = 4, 40, 4, 16, 16
    q = torch.randn(B, T, H, K, dtype=torch.bfloat16, device=device)
    k = F.normalize(torch.randn(B, T, H, K, dtype=torch.bfloat16, device=device), p=2, dim=-1)
    v = torch.randn(B, T, H, V, dtype=torch.bfloat16, device=device)
    beta = torch.rand(B, T, H, dtype=torch.bfloat16, device=device).sigmoid()
    g = F.logsigmoid(torch.rand(B, T, H, dtype=torch.bfloat16, device=device))
    h0 = torch.randn(B, H, K, V, dtype=torch.bfloat16, device=device)
    o, ht = chunk_gated_delta_rule(
        q, k, v, g, beta,
        initial_state=h0,
        output_final_state=True
    )
    _check(o, ht, (q, k, v, g, beta), initial_state=h0.double())
    # for variable-length inputs, the batch size `B` is expected to be 1 and `cu_seqlens` is required
    q, k, v, beta, g = map(lambda x: x.flatten(0, 1)[None], (q, k, v, beta, g))
    # for a batch with 4 sequences, `cu_seqlens` with 5 start/end positions are expected
    cu_seqlens = q.new_tensor([0, 40, 80, 120, 160], dtype=torch.long)
    o_var, ht_var = chunk_gated_delta_rule(
        q, k, v, g, beta,
        initial_state=h0,
        output_final_state=True,
        cu_seqlens=cu_seqlens
    )
    assert o.allclose(o_var.view(o.shape))
    assert ht.allclose(ht_var)


def test_fused_recurrent_gated_delta_rule_docstring():
    from flashgrad import fused_recurrent_gated_delta_rule

    B, T, H, K, V = 4, 30, 4, 16, 16
    q = torch.randn(B, T, H, K, device=device)
    k = F.normalize(torch.randn(B, T, H, K, device=device), p=2, dim=-1)
    v = torch.randn(B, T, H, V, device=device)
    g = F.logsigmoid(torch.rand(B, T, H, device=device))
    beta = torch.rand(B, T, H, device=device).sigmoid()
    h0 = torch.randn(B, H, K, V, device=device)
    o, ht = fused_recurrent_gated_delta_rule(
        q, k, v, g, beta,
        initial_state=h0,
        output_final_state=True
    )
    _check(o, ht, (q, k, v, g, beta), initial_state=h0.double())
    q, k, v, g, beta = map(lambda x: x.flatten(0, 1)[None], (q, k, v, g, beta))
    cu_seqlens = q.new_tensor([0, 30, 60, 90, 120], dtype=torch.long)
    o_var, ht_var = fused_recurrent_gated_delta_rule(
        q, k, v, g, beta,
        initial_state=h0,
        output_final_state=True,
        cu_seqlens=cu_seqlens
    )
    assert o.allclose(o_var.view(o.shape), rtol=1e-5, atol=1e-5)
    assert ht.allclose(ht_var, rtol=1e-5, atol=1e-5)


def test_chunk_kda_docstring():
    from flashgrad import chunk_kda

    # inputs with equal lengths (no GVA, HV == H)
    B, T, H, K, V = 2, 30, 2, 16, 16
    q = torch.randn(B, T, H, K, dtype=torch.bfloat16, device=device)
    k = torch.randn(B, T, H, K, dtype=torch.bfloat16, device=device)
    v = torch.randn(B, T, H, V, dtype=torch.bfloat16, device=device)
    beta = torch.rand(B, T, H, dtype=torch.bfloat16, device=device)
    g = torch.rand(B, T, H, K, dtype=torch.bfloat16, device=device)
    h0 = torch.randn(B, H, K, V, dtype=torch.bfloat16, device=device)
    A_log = torch.randn(H, dtype=torch.float32, device=device)
    dt_bias = torch.randn(H * K, dtype=torch.float32, device=device)
    o, ht = chunk_kda(
        q, k, v, g, beta,
        A_log=A_log,
        dt_bias=dt_bias,
        use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True,
        initial_state=h0,
        output_final_state=True
    )
    gate = -A_log.double().exp()[:, None] * F.softplus(g.double() + dt_bias.double().view(H, K))
    _check(o, ht, (q, k, v, gate, beta), initial_state=h0.double(), l2=True)
    # GVA mode (HV > H)
    HV = 4  # 2x more value heads than qk heads
    v = torch.randn(B, T, HV, V, dtype=torch.bfloat16, device=device)
    g = torch.rand(B, T, HV, K, dtype=torch.bfloat16, device=device)
    beta = torch.rand(B, T, HV, dtype=torch.bfloat16, device=device)
    h0 = torch.randn(B, HV, K, V, dtype=torch.bfloat16, device=device)
    A_log = torch.randn(HV, dtype=torch.float32, device=device)
    dt_bias = torch.randn(HV * K, dtype=torch.float32, device=device)
    o, ht = chunk_kda(
        q, k, v, g, beta,
        A_log=A_log,
        dt_bias=dt_bias,
        use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True,
        initial_state=h0,
        output_final_state=True
    )
    gate = -A_log.double().exp()[:, None] * F.softplus(g.double() + dt_bias.double().view(HV, K))
    _check(o, ht, (q, k, v, gate, beta), initial_state=h0.double(), l2=True)
    # for variable-length inputs, the batch size `B` is expected to be 1 and `cu_seqlens` is required
    q, k, v, beta, g = map(lambda x: x.flatten(0, 1)[None], (q, k, v, beta, g))
    cu_seqlens = q.new_tensor([0, 30, 60], dtype=torch.long)
    o_var, ht_var = chunk_kda(
        q, k, v, g, beta,
        A_log=A_log,
        dt_bias=dt_bias,
        use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True,
        initial_state=h0,
        output_final_state=True,
        cu_seqlens=cu_seqlens
    )
    assert o.allclose(o_var.view(o.shape))
    assert ht.allclose(ht_var)


def test_fused_recurrent_kda_docstring():
    from flashgrad import fused_recurrent_kda

    B, T, H, HV, K, V = 2, 20, 2, 4, 16, 16
    q = torch.randn(B, T, H, K, device=device)
    k = F.normalize(torch.randn(B, T, H, K, device=device), p=2, dim=-1)
    v = torch.randn(B, T, HV, V, device=device)
    g = F.logsigmoid(torch.rand(B, T, HV, K, device=device))
    beta = torch.rand(B, T, HV, device=device).sigmoid()
    h0 = torch.randn(B, HV, K, V, device=device)
    o, ht = fused_recurrent_kda(
        q, k, v, g, beta,
        initial_state=h0,
        output_final_state=True
    )
    _check(o, ht, (q, k, v, g, beta), initial_state=h0.double())


def test_delta_rule_docstrings():
    from flashgrad import chunk_delta_rule, fused_recurrent_delta_rule

    B, T, H, K, V = 2, 20, 2, 16, 16
    q = torch.randn(B, T, H, K, device=device, requires_grad=True)
    k = F.normalize(torch.randn(B, T, H, K, device=device), p=2, dim=-1)
    v = torch.randn(B, T, H, V, device=device)
    beta = torch.rand(B, T, H, device=device).sigmoid()
    h0 = torch.randn(B, H, K, V, device=device)
    for fn in (fused_recurrent_delta_rule, chunk_delta_rule):
        o, ht = fn(
            q, k, v, beta,
            initial_state=h0,
            output_final_state=True
        )
        _check(o, ht, (q, k, v, None, beta), initial_state=h0.double())
        o.sum().backward()
        assert torch.isfinite(q.grad).all()


def test_swapping_the_import():
    # `from fla.ops.gated_delta_rule import chunk_gated_delta_rule` -> `from flashgrad import ...`
    names = ["flash_attn_func", "flash_attn_varlen_func", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule",
             "chunk_kda", "fused_recurrent_kda", "chunk_delta_rule", "fused_recurrent_delta_rule"]
    for name in names:
        assert callable(getattr(flashgrad, name)) and name in dir(flashgrad)
