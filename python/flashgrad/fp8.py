"""FP8 (e4m3) quantization for attention inputs: current scaling per (sequence, kv head).

The recipe (docs/fp8.md): for sequence (batch row, or packed sequence) n and kv head g,

    amax[n, g]    = max |x| over that sequence's tokens and the heads that read kv head g
                    (for q: the Hq / Hk query heads of the group; for k, v: head g itself)
    descale[n, g] = amax[n, g] * (1 / 448)   (1 when amax == 0: an all-zero block stays zero;
                                              1/448 as a float32 constant, so that every framework
                                              gets the same bits: XLA turns a division by a
                                              constant into this multiplication anyway)
    x8            = e4m3(x / descale)        round to nearest even, saturating to +-448

so that x8 * descale recovers x to e4m3's 3 mantissa bits, and the largest entry of each block
lands on 448 (e4m3's largest finite value). descale is float32 [N, Hk], the layout of the
low-level op's descale_q / descale_k / descale_v (true value = stored * descale).

Everything here is plain torch (runs on any device, no host synchronization), so it can sit
inside torch.compile graphs and autograd Functions.
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # largest finite e4m3fn value: 1.75 * 2^8
INV_E4M3_MAX = 1.0 / E4M3_MAX  # rounded to float32 where it multiplies a float32 tensor


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x (any float dtype) rounded to e4m3fn, nearest even, saturating to +-448 (torch's cast
    alone turns values past the range into NaN). NaN stays NaN."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def round_e4m3(x: torch.Tensor) -> torch.Tensor:
    """to_e4m3(x) as float32: the fake quantization the emulation uses."""
    return to_e4m3(x).float()


def descale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """amax (float32, >= 0) -> descale = amax * (1/448), 1 where amax == 0."""
    amax = amax.float()
    return torch.where(amax > 0, amax * INV_E4M3_MAX, torch.ones_like(amax))


def sequence_of_token(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """int64 [total]: the sequence each packed token belongs to. Token t is in sequence n when
    cu[n] <= t < cu[n+1]; that n is the number of sequence ends cu[1..N] at or before t (empty
    sequences contribute an end equal to the next start, so they are skipped). Tokens past the
    last end (malformed cu_seqlens, rejected later by the op) are clamped into the last sequence."""
    ends = cu_seqlens[1:].to(torch.int64)
    tokens = torch.arange(total, device=cu_seqlens.device, dtype=torch.int64)
    seq = torch.searchsorted(ends, tokens, right=True)
    return seq.clamp_(max=max(ends.numel() - 1, 0))


def _split_heads(x: torch.Tensor, heads_k: int) -> torch.Tensor:
    """[..., H, D] -> [..., Hk, H / Hk, D]: query head h sits in group h // (H / Hk)."""
    *lead, heads, dim = x.shape
    return x.reshape(*lead, heads_k, heads // heads_k, dim)


def amax_per_head(x: torch.Tensor, heads_k: int, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """float32 [N, Hk]: max |x| per (sequence, kv-head group). Padded x [B, S, H, D] (N = B),
    packed x [T, H, D] with cu_seqlens [N+1]."""
    if cu_seqlens is None:
        batch = x.shape[0]
        if x.shape[1] == 0 or x.shape[-1] == 0:
            return torch.zeros(batch, heads_k, device=x.device, dtype=torch.float32)
        grouped = _split_heads(x, heads_k)                      # [B, S, Hk, G, D]
        return grouped.abs().amax(dim=(1, 3, 4)).float()
    num_seqs = max(cu_seqlens.numel() - 1, 0)
    amax = torch.zeros(max(num_seqs, 1), heads_k, device=x.device, dtype=torch.float32)
    if x.shape[0] > 0 and x.shape[-1] > 0:
        per_token = _split_heads(x, heads_k).abs().amax(dim=(2, 3)).float()   # [T, Hk]
        seq = sequence_of_token(cu_seqlens, x.shape[0])
        amax.scatter_reduce_(0, seq[:, None].expand(-1, heads_k), per_token, reduce="amax")
    return amax[:num_seqs]


def _descale_per_element(descale: torch.Tensor, x: torch.Tensor, heads_k: int,
                         cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """descale [N, Hk] broadcast against _split_heads(x): [B, 1, Hk, 1, 1] or [T, Hk, 1, 1]."""
    if cu_seqlens is None:
        return descale[:, None, :, None, None]
    return descale[sequence_of_token(cu_seqlens, x.shape[0])][:, :, None, None]


def quantize_per_head(x: torch.Tensor, heads_k: int, cu_seqlens: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x8 float8_e4m3fn of x's shape, descale float32 [N, Hk]) with current scaling per
    (sequence, kv head); for q pass the kv head count so that a group shares one scale."""
    descale = descale_from_amax(amax_per_head(x, heads_k, cu_seqlens))
    grouped = _split_heads(x, heads_k).float()
    x8 = to_e4m3(grouped / _descale_per_element(descale, x, heads_k, cu_seqlens))
    return x8.reshape(x.shape), descale


def dequantize_per_head(x8: torch.Tensor, descale: torch.Tensor,
                        cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """float32 x8 * descale (the values the low-level op computes with)."""
    heads_k = descale.shape[1]
    grouped = _split_heads(x8, heads_k).float()
    return (grouped * _descale_per_element(descale, x8, heads_k, cu_seqlens)).reshape(x8.shape)
