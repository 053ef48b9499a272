"""FP8 attention for JAX (flashgrad.jax.flash_attention_fp8): the jax.numpy quantizer gives the
same bits as PyTorch's; forward and jax.grad under jit give the same bits as
flashgrad.flash_attn_fp8_func (both call the same backend on the same quantized inputs) and the
attention of the dequantized inputs to bf16 rounding; errors name the argument; on a GPU (when
JAX sees one and the FP8 kernels exist) the same against PyTorch on the GPU."""

from __future__ import annotations

import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
import jax.numpy as jnp  # noqa: E402

import flashgrad.jax as fgj  # noqa: E402
from flashgrad import flash_attn_fp8_func, flash_attn_varlen_fp8_func  # noqa: E402
from flashgrad.fp8 import quantize_per_head as torch_quantize  # noqa: E402
from flashgrad.jax_fp8 import quantize_per_head as jax_quantize  # noqa: E402


@pytest.fixture(autouse=True)
def _on_the_cpu_unless_gpu(request):
    """Bitwise comparisons with PyTorch on the CPU run on JAX's CPU device even where its default
    device is a GPU."""
    if "gpu" in request.keywords:
        yield
        return
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.fixture
def key():
    seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
    print(f"random seed of this test: {seed}")
    return jax.random.PRNGKey(seed)


def bf16(key, *shape):
    return jax.random.normal(key, shape, jnp.float32).astype(jnp.bfloat16)


def to_torch(x):
    return torch.from_numpy(np.asarray(x.astype(jnp.float32))).bfloat16()


def as_f32(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32))


def test_quantizer_matches_pytorch_bitwise(key):
    x = bf16(key, 2, 7, 6, 16) * 3
    x8, descale = jax_quantize(x, 2)
    t8, tdescale = torch_quantize(to_torch(x), 2)
    assert x8.dtype == jnp.float8_e4m3fn
    np.testing.assert_array_equal(np.asarray(descale), tdescale.numpy())
    np.testing.assert_array_equal(as_f32(x8), t8.float().numpy())
    cu = jnp.array([0, 5, 5, 12], dtype=jnp.int32)
    y = bf16(key, 12, 4, 16)
    y8, ydescale = jax_quantize(y, 2, cu)
    u8, udescale = torch_quantize(to_torch(y), 2, torch.tensor([0, 5, 5, 12], dtype=torch.int32))
    np.testing.assert_array_equal(np.asarray(ydescale), udescale.numpy())
    assert (np.asarray(ydescale)[1] == 1).all()  # the empty sequence
    np.testing.assert_array_equal(as_f32(y8), u8.float().numpy())


def _jax_and_torch(key, kwargs, varlen=False, device="cpu", d=32):
    """d: head dim (the CUDA kernels take 64, 128, 256)."""
    ks = jax.random.split(key, 5)
    if varlen:
        cu_q, cu_k = [0, 6, 6, 13], [0, 8, 9, 17]
        q, k, v = bf16(ks[0], 13, 4, d), bf16(ks[1], 17, 2, d), bf16(ks[2], 17, 2, d)
        jkw = dict(cu_seqlens_q=jnp.array(cu_q, jnp.int32), cu_seqlens_k=jnp.array(cu_k, jnp.int32),
                   max_seqlen_q=7, max_seqlen_k=8, **kwargs)
    else:
        q, k, v = bf16(ks[0], 2, 9, 4, d), bf16(ks[1], 2, 11, 2, d), bf16(ks[2], 2, 11, 2, d)
        jkw = dict(kwargs)
    w = jax.random.normal(ks[3], q.shape, jnp.float32)
    lse_shape = (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])
    wl = jax.random.normal(ks[4], lse_shape, jnp.float32)

    def loss(q, k, v):
        out, lse = fgj.flash_attention_fp8(q, k, v, return_lse=True, **jkw)
        return (out.astype(jnp.float32) * w).sum() + (lse * wl).sum(), (out, lse)

    (value, (out, lse)), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)

    tq, tk, tv = (to_torch(x).to(device).requires_grad_() for x in (q, k, v))
    if varlen:
        tout, tlse = flash_attn_varlen_fp8_func(tq, tk, tv, torch.tensor(cu_q, dtype=torch.int32, device=device),
                                                torch.tensor(cu_k, dtype=torch.int32, device=device), 7, 8,
                                                return_lse=True, **kwargs)
    else:
        tout, tlse = flash_attn_fp8_func(tq, tk, tv, return_lse=True, **kwargs)
    tloss = (tout.float() * torch.from_numpy(np.asarray(w)).to(device)).sum() \
        + (tlse * torch.from_numpy(np.asarray(wl)).to(device)).sum()
    tgrads = torch.autograd.grad(tloss, (tq, tk, tv))
    return (out, lse, *grads), (tout, tlse, *tgrads)


@pytest.mark.parametrize("case", ["causal", "softcap_window", "varlen"])
def test_forward_and_grad_match_pytorch_bitwise(key, case):
    kwargs = {"causal": dict(causal=True), "softcap_window": dict(softcap=2.0, window_size=(3, 2)),
              "varlen": dict(causal=True)}[case]
    jx, tx = _jax_and_torch(key, kwargs, varlen=case == "varlen")
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), jx, tx):
        assert a.dtype == (jnp.float32 if name == "lse" else jnp.bfloat16), name
        np.testing.assert_array_equal(as_f32(a), b.detach().float().cpu().numpy(), err_msg=name)


def test_forward_is_the_attention_of_dequantized_inputs(key):
    ks = jax.random.split(key, 3)
    q, k, v = bf16(ks[0], 1, 8, 2, 32), bf16(ks[1], 1, 8, 2, 32), bf16(ks[2], 1, 8, 2, 32)
    out = fgj.flash_attention_fp8(q, k, v, causal=True)
    deq = [(x8.astype(jnp.float32).reshape(1, 8, 2, 1, 32) * d[:, None, :, None, None]).reshape(x.shape)
           for x, (x8, d) in ((x, jax_quantize(x, 2)) for x in (q, k, v))]
    ref = fgj.flash_attention(*deq, causal=True)
    err = np.abs(as_f32(out) - np.asarray(ref))
    assert (err <= 2.0 ** -8 * np.abs(np.asarray(ref)) + 1e-6).all()


def test_errors_name_the_argument(key):
    q = bf16(key, 1, 4, 2, 16)
    with pytest.raises(ValueError, match="argument 'q'"):
        fgj.flash_attention_fp8(q.astype(jnp.int32), q, q)
    with pytest.raises(ValueError, match="argument 'k'"):
        fgj.flash_attention_fp8(q, bf16(key, 1, 4, 3, 16), bf16(key, 1, 4, 3, 16))
    with pytest.raises(ValueError, match="argument 'cu_seqlens_q'"):
        fgj.flash_attention_fp8(q[0], q[0], q[0], cu_seqlens_q=jnp.array([0, 4]))
    with pytest.raises(ValueError, match="argument 'softcap_method'"):
        fgj.flash_attention_fp8(q, q, q, softcap_method="cubic")


def _gpu_skip_reason():
    if jax.default_backend() != "gpu":
        return f"no CUDA device for JAX: default backend is {jax.default_backend()}"
    import flashgrad
    if not flashgrad.build_info()["cuda"] or not torch.cuda.is_available():
        return "flashgrad was built without its CUDA backend, or torch sees no GPU"
    x = torch.zeros(1, 16, 1, 64, device="cuda", dtype=torch.bfloat16)
    try:
        flash_attn_fp8_func(x, x, x)
    except NotImplementedError as error:
        return f"the CUDA backend refuses e4m3 attention: {error}"
    return None


@pytest.mark.gpu
def test_gpu_matches_pytorch_on_the_gpu(key):
    reason = _gpu_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    jx, tx = _jax_and_torch(key, dict(causal=True), device="cuda", d=64)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), jx, tx):
        b = b.detach().float().cpu().numpy()
        if name == "dq":  # fp32 atomics: the accumulation order may differ between the calls
            np.testing.assert_allclose(as_f32(a), b, rtol=2 ** -7, atol=1e-3 * np.abs(b).max(), err_msg=name)
        else:
            np.testing.assert_array_equal(as_f32(a), b, err_msg=name)
