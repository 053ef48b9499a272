"""Bad input raises ValueError (or NotImplementedError for valid but unsupported requests) whose
message names the argument, from the PyTorch functions; never a crash."""

from __future__ import annotations

import re

import pytest
import torch

from flashgrad import (chunk_gated_delta_rule, chunk_kda, flash_attn_func, flash_attn_varlen_func,
                       fused_recurrent_delta_rule, fused_recurrent_gated_delta_rule)

F64 = torch.float64


def raises(kind, arg, fn, *args, **kwargs):
    with pytest.raises(kind, match=re.escape(f"argument '{arg}'")) as info:
        fn(*args, **kwargs)
    return str(info.value)


def qkv(b=1, sq=5, sk=6, hq=4, hk=2, d=8, dtype=F64):
    return (torch.randn(b, sq, hq, d, dtype=dtype), torch.randn(b, sk, hk, d, dtype=dtype),
            torch.randn(b, sk, hk, d, dtype=dtype))


# ---- attention ----------------------------------------------------------------------------------


def test_attention_wrong_rank():
    q, k, v = qkv()
    msg = raises(ValueError, "q", flash_attn_func, q[0], k, v)
    assert "rank 4" in msg
    raises(ValueError, "k", flash_attn_func, q, k[0], v)
    cu = torch.tensor([0, 5], dtype=torch.int32)
    raises(ValueError, "q", flash_attn_varlen_func, q, k[0], v[0], cu, torch.tensor([0, 6], dtype=torch.int32), 5, 6)


def test_attention_dtype_mix_and_unsupported_dtype():
    q, k, v = qkv()
    raises(ValueError, "k", flash_attn_func, q, k.float(), v)
    raises(ValueError, "v", flash_attn_func, q, k, v.half())
    raises(ValueError, "q", flash_attn_func, q.to(torch.int32), k.to(torch.int32), v.to(torch.int32))


def test_attention_shape_rules():
    q, k, v = qkv()
    raises(ValueError, "k", flash_attn_func, q, k[..., :4], v)  # head dims differ
    raises(ValueError, "k", flash_attn_func, q[:, :, :3], k, v)  # Hq % Hk != 0
    raises(ValueError, "v", flash_attn_func, q, k, v[:, :4])  # Sk differs


def test_attention_bad_cu_seqlens():
    q, k, v = (torch.randn(9, 2, 8, dtype=F64) for _ in range(3))
    good = torch.tensor([0, 4, 9], dtype=torch.int32)

    def call(cu_q, cu_k=good):
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 9)

    assert "non-decreasing" in raises(ValueError, "cu_seqlens_q", call, torch.tensor([0, 5, 4, 9], dtype=torch.int32),
                                      torch.tensor([0, 4, 5, 9], dtype=torch.int32))
    raises(ValueError, "cu_seqlens_q", call, torch.tensor([1, 4, 9], dtype=torch.int32))  # not starting at 0
    raises(ValueError, "cu_seqlens_q", call, torch.tensor([0, 4, 8], dtype=torch.int32))  # not ending at Tq
    raises(ValueError, "cu_seqlens_k", call, good, torch.tensor([0, 4, 10], dtype=torch.int32))  # past Tk
    raises(ValueError, "cu_seqlens_q", call, torch.tensor([0.0, 4.0, 9.0]))  # not integers
    raises(ValueError, "cu_seqlens_k", call, good, torch.tensor([0, 9], dtype=torch.int32))  # count differs
    raises(ValueError, "cu_seqlens_q", flash_attn_varlen_func, q, k, v, None, good, 9, 9)


def test_attention_bad_options():
    q, k, v = qkv()
    raises(NotImplementedError, "dropout_p", flash_attn_func, q, k, v, 0.1)
    raises(NotImplementedError, "alibi_slopes", flash_attn_func, q, k, v, alibi_slopes=torch.ones(4))
    raises(ValueError, "softcap_method", flash_attn_func, q, k, v, softcap=1.0, softcap_method="relu")
    raises(ValueError, "softcap", flash_attn_func, q, k, v, softcap=-1.0)
    raises(ValueError, "window_size", flash_attn_func, q, k, v, window_size=3)
    raises(ValueError, "prefix_lengths", flash_attn_func, q, k, v, prefix_lengths=torch.tensor([1, 2, 3]))
    raises(ValueError, "candidate_bounds", flash_attn_func, q, k, v, causal=True,
           candidate_bounds=torch.tensor([[0, 2, 2, 4]]))
    raises(ValueError, "softmax_scale", flash_attn_func, q, k, v, softmax_scale=float("inf"))


@pytest.mark.gpu
def test_attention_device_mix():
    q, k, v = qkv(dtype=torch.bfloat16)
    raises(ValueError, "k", flash_attn_func, q.cuda(), k, v.cuda())
    raises(ValueError, "v", flash_attn_func, q.cuda(), k.cuda(), v)


def test_attention_device_mix_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("covered by test_attention_device_mix on this machine")
    q, k, v = qkv()
    raises(ValueError, "k", flash_attn_func, q, k.to("meta"), v)


# ---- delta rule --------------------------------------------------------------------------------


def gdn(b=1, t=6, h=2, hv=4, k=4, v=3):
    return (torch.randn(b, t, h, k, dtype=F64), torch.randn(b, t, h, k, dtype=F64), torch.randn(b, t, hv, v, dtype=F64),
            -torch.rand(b, t, hv, dtype=F64), torch.rand(b, t, hv, dtype=F64))


def test_delta_rule_shape_and_dtype_rules():
    q, k, v, g, beta = gdn()
    raises(ValueError, "q", chunk_gated_delta_rule, q[0], k, v, g, beta)
    raises(ValueError, "k", chunk_gated_delta_rule, q, k[..., :3], v, g, beta)
    raises(ValueError, "v", chunk_gated_delta_rule, q, k, v.float(), g, beta)
    raises(ValueError, "v", chunk_gated_delta_rule, q, k, v[:, :, :3], g[..., :3], beta[..., :3])  # HV % H
    raises(ValueError, "g", chunk_gated_delta_rule, q, k, v, g[..., :2], beta)
    raises(ValueError, "g", chunk_kda, q, k, v, g[..., None].expand(-1, -1, -1, 3), beta)
    raises(ValueError, "beta", fused_recurrent_gated_delta_rule, q, k, v, g, beta[:, :5])
    raises(ValueError, "initial_state", chunk_gated_delta_rule, q, k, v, g, beta,
           initial_state=torch.zeros(1, 4, 3, 4, dtype=F64))


def test_delta_rule_bad_cu_seqlens():
    q, k, v, g, beta = gdn()
    raises(ValueError, "cu_seqlens", chunk_gated_delta_rule, q, k, v, g, beta,
           cu_seqlens=torch.tensor([0, 4, 2, 6]))  # decreasing
    raises(ValueError, "cu_seqlens", chunk_gated_delta_rule, q, k, v, g, beta,
           cu_seqlens=torch.tensor([0, 4, 7]))  # past T
    raises(ValueError, "cu_seqlens", chunk_gated_delta_rule, q, k, v, g, beta,
           cu_seqlens=torch.tensor([0.0, 6.0]))  # not integers
    q2, k2, v2, g2, beta2 = gdn(b=2)
    raises(ValueError, "cu_seqlens", fused_recurrent_delta_rule, q2, k2, v2, beta2,
           cu_seqlens=torch.tensor([0, 3, 6]))  # needs B == 1
    raises(ValueError, "initial_state", chunk_gated_delta_rule, q, k, v, g, beta,
           initial_state=torch.zeros(1, 4, 4, 3, dtype=F64), cu_seqlens=torch.tensor([0, 2, 6]))


def test_delta_rule_unsupported_options():
    q, k, v, g, beta = gdn()
    raises(NotImplementedError, "head_first", chunk_gated_delta_rule, q, k, v, g, beta, head_first=True)
    raises(NotImplementedError, "return_intermediate_states", chunk_kda, q, k, v,
           g[..., None].expand(-1, -1, -1, 4), beta, return_intermediate_states=True)
    with pytest.raises(TypeError, match="no_such_option"):
        chunk_gated_delta_rule(q, k, v, g, beta, no_such_option=1)


def test_delta_rule_device_mix_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("covered by test_delta_rule_device_mix on this machine")
    q, k, v, g, beta = gdn()
    raises(ValueError, "beta", chunk_gated_delta_rule, q, k, v, g, beta.to("meta"))


@pytest.mark.gpu
def test_delta_rule_device_mix():
    q, k, v, g, beta = (t.float() for t in gdn())
    raises(ValueError, "k", chunk_gated_delta_rule, q.cuda(), k, v.cuda(), g.cuda(), beta.cuda())
    raises(ValueError, "g", fused_recurrent_gated_delta_rule, q.cuda(), k.cuda(), v.cuda(), g, beta.cuda())
