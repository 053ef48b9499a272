"""A small model built on flashgrad's ops under torch.compile(fullgraph=True): the same loss and
gradients as eager (the ops are opaque to the compiler; their fake shape functions and autograd
registrations carry them through Dynamo and AOT autograd without graph breaks)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flashgrad import chunk_gated_delta_rule, flash_attn_func, flash_attn_varlen_func, fused_recurrent_kda


class TinyBlock(torch.nn.Module):
    """Softmax attention (GQA, causal, softcap, lse z-loss) followed by a GDN layer and a KDA layer."""

    def __init__(self, dim=16, heads=4, kv_heads=2, head_dim=4):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q = torch.nn.Linear(dim, heads * head_dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * head_dim)
        self.o = torch.nn.Linear(heads * head_dim, dim)
        self.qkv_lin = torch.nn.Linear(dim, 3 * heads * head_dim)
        self.gates = torch.nn.Linear(dim, 2 * heads + heads * head_dim)
        self.out = torch.nn.Linear(2 * heads * head_dim, dim)

    def forward(self, x, h0):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim)
        k, v = self.kv(x).view(b, t, 2, self.kv_heads, self.head_dim).unbind(2)
        a, lse = flash_attn_func(q, k, v, causal=True, softcap=5.0, return_lse=True)
        x = x + self.o(a.reshape(b, t, -1))
        ql, kl, vl = self.qkv_lin(x).view(b, t, 3, self.heads, self.head_dim).unbind(2)
        gl = self.gates(x)
        g = F.logsigmoid(gl[..., : self.heads])
        beta = torch.sigmoid(gl[..., self.heads: 2 * self.heads])
        gk = F.logsigmoid(gl[..., 2 * self.heads:]).view(b, t, self.heads, self.head_dim)
        o1, state = chunk_gated_delta_rule(ql, kl, vl, g, beta, initial_state=h0, output_final_state=True,
                                           use_qk_l2norm_in_kernel=True)
        o2, _ = fused_recurrent_kda(ql, kl, vl, gk, beta, use_qk_l2norm_in_kernel=True)
        y = self.out(torch.cat([o1, o2], dim=-1).reshape(b, t, -1))
        return (y ** 2).mean() + 1e-3 * (lse ** 2).mean() + state.square().mean()


def _loss_and_grads(model, x, h0):
    loss = model(x, h0)
    grads = torch.autograd.grad(loss, [*model.parameters(), x, h0])
    return loss.detach(), [g.detach() for g in grads]


def test_compiled_model_matches_eager(rng):
    torch._dynamo.reset()
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)))
    model = TinyBlock().double()
    x = torch.randn(2, 11, 16, generator=rng, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 4, 4, 4, generator=rng, dtype=torch.float64, requires_grad=True)
    eager_loss, eager_grads = _loss_and_grads(model, x, h0)
    # dynamic=True: the shape functions run on symbolic sizes (one graph for both input shapes).
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    loss, grads = _loss_and_grads(compiled, x, h0)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-12, atol=1e-14)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12)
    # A second input shape goes through the same compiled graph.
    x2 = torch.randn(1, 7, 16, generator=rng, dtype=torch.float64, requires_grad=True)
    h2 = h0[:1].detach().clone().requires_grad_()
    torch.testing.assert_close(compiled(x2, h2), model(x2, h2), rtol=1e-12, atol=1e-14)


def test_compiled_varlen_attention(rng):
    torch._dynamo.reset()
    q = torch.randn(9, 4, 8, generator=rng, dtype=torch.float64, requires_grad=True)
    k = torch.randn(12, 2, 8, generator=rng, dtype=torch.float64, requires_grad=True)
    v = torch.randn(12, 2, 8, generator=rng, dtype=torch.float64, requires_grad=True)
    cu_q = torch.tensor([0, 4, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 12], dtype=torch.int32)

    def f(q, k, v):
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 7, causal=True).sin().sum()

    compiled = torch.compile(f, fullgraph=True)
    g_eager = torch.autograd.grad(f(q, k, v), (q, k, v))
    g_comp = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    for a, b in zip(g_comp, g_eager):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
