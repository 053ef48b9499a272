"""The demo model's token mixers: causal softmax attention and the gated delta rule.

Each mixer does its projections and gates in fp32 PyTorch and hands the kernel call to a Kernels
set (flashgrad's ops or the plain references), casting to the set's compute dtype around it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .kernels import Kernels


class AttentionMixer(nn.Module):
    """Causal softmax attention with tanh softcap and grouped-query heads (heads_q % heads_kv == 0).

    forward returns (y, lse): lse [B, heads_q, T] feeds the z-loss, None when the kernel set
    applies the z-loss inside its backward instead.
    """

    kind = "attention"

    def __init__(self, d_model: int, heads_q: int, heads_kv: int, head_dim: int, softcap: float):
        super().__init__()
        assert heads_q % heads_kv == 0, "GQA needs heads_q to be a multiple of heads_kv"
        self.heads_q, self.heads_kv, self.head_dim = heads_q, heads_kv, head_dim
        self.softcap = softcap
        self.to_q = nn.Linear(d_model, heads_q * head_dim, bias=False)
        self.to_k = nn.Linear(d_model, heads_kv * head_dim, bias=False)
        self.to_v = nn.Linear(d_model, heads_kv * head_dim, bias=False)
        self.to_out = nn.Linear(heads_q * head_dim, d_model, bias=False)

    def forward(self, x: torch.Tensor, kernels: Kernels, z_loss_weight: float = 0.0):
        batch, steps, _ = x.shape
        dtype = kernels.compute_dtype
        q = self.to_q(x).view(batch, steps, self.heads_q, self.head_dim).to(dtype)
        k = self.to_k(x).view(batch, steps, self.heads_kv, self.head_dim).to(dtype)
        v = self.to_v(x).view(batch, steps, self.heads_kv, self.head_dim).to(dtype)
        # A kernel that takes z_loss_weight adds weight * lse_i to each dLSE_i; dividing by the
        # element count makes that the gradient of (w/2) * mean(lse^2), as with a returned lse.
        per_element_weight = z_loss_weight / (batch * steps * self.heads_q)
        out, lse = kernels.attention(q, k, v, softcap=self.softcap,
                                     z_loss_weight=per_element_weight)
        y = self.to_out(out.to(x.dtype).reshape(batch, steps, self.heads_q * self.head_dim))
        return y, lse


class GatedDeltaMixer(nn.Module):
    """A Gated DeltaNet token mixer (one scalar decay per value head and step).

    mode "chunk" calls the chunked kernel (training throughput), "recurrent" the fused recurrent
    one (step by step; flashgrad gives it a backward). q and k are L2-normalized inside the op.
        beta = sigmoid(W_b x)                                   in (0, 1): the write strength
        g    = -exp(A_log) * softplus(W_a x + dt_bias)          < 0: the log of the decay
        y    = W_o (rmsnorm(o) * silu(W_gate x))                per value head
    """

    def __init__(self, d_model: int, heads: int, value_heads: int, key_dim: int, value_dim: int,
                 mode: str):
        super().__init__()
        assert mode in ("chunk", "recurrent")
        assert value_heads % heads == 0, "value_heads must be a multiple of heads"
        self.kind = f"{mode}_gdn"
        self.mode = mode
        self.heads, self.value_heads = heads, value_heads
        self.key_dim, self.value_dim = key_dim, value_dim
        self.to_q = nn.Linear(d_model, heads * key_dim, bias=False)
        self.to_k = nn.Linear(d_model, heads * key_dim, bias=False)
        self.to_v = nn.Linear(d_model, value_heads * value_dim, bias=False)
        self.to_beta = nn.Linear(d_model, value_heads, bias=False)
        self.to_decay = nn.Linear(d_model, value_heads, bias=False)
        self.to_gate = nn.Linear(d_model, value_heads * value_dim, bias=False)
        self.to_out = nn.Linear(value_heads * value_dim, d_model, bias=False)
        self.out_norm = nn.RMSNorm(value_dim, eps=1e-5)
        # Mamba-2 style decay: rate exp(A_log) in [1, 16], step softplus(dt_bias) in [1e-3, 1e-1],
        # so a head forgets anywhere from ~0.1% to ~80% of its state per step at the start.
        self.A_log = nn.Parameter(torch.log(torch.empty(value_heads).uniform_(1, 16)))
        step = torch.exp(torch.empty(value_heads).uniform_(math.log(1e-3), math.log(1e-1)))
        self.dt_bias = nn.Parameter(step + torch.log(-torch.expm1(-step)))  # softplus^-1(step)

    def forward(self, x: torch.Tensor, kernels: Kernels, z_loss_weight: float = 0.0):
        batch, steps, _ = x.shape
        dtype = kernels.compute_dtype
        q = self.to_q(x).view(batch, steps, self.heads, self.key_dim)
        k = self.to_k(x).view(batch, steps, self.heads, self.key_dim)
        v = self.to_v(x).view(batch, steps, self.value_heads, self.value_dim)
        beta = torch.sigmoid(self.to_beta(x))
        g = -torch.exp(self.A_log) * F.softplus(self.to_decay(x) + self.dt_bias)
        op = (kernels.chunk_gated_delta_rule if self.mode == "chunk"
              else kernels.recurrent_gated_delta_rule)
        # Gates stay in fp32 even when q, k, v are bf16 (the ops accept that, as fla's do): the
        # decay is summed over many steps, where bf16's 8 bits would drift.
        gate_dtype = torch.promote_types(dtype, torch.float32)
        o = op(q.to(dtype), k.to(dtype), v.to(dtype), g.to(gate_dtype), beta.to(gate_dtype))
        o = o.to(x.dtype)
        gate = F.silu(self.to_gate(x)).view(batch, steps, self.value_heads, self.value_dim)
        y = self.to_out((self.out_norm(o) * gate).reshape(batch, steps, -1))
        return y, None
