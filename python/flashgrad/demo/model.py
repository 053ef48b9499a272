"""A tiny hybrid character-level language model: gated delta rule and attention blocks."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .kernels import Kernels
from .layers import AttentionMixer, GatedDeltaMixer

# The mixer of each block, bottom to top. The first block is a delta-rule layer: it orders the
# tokens, so the attention layers above need no positional encoding.
DEFAULT_LAYOUT = ("chunk_gdn", "attention", "recurrent_gdn", "attention")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int = 64
    layout: tuple[str, ...] = DEFAULT_LAYOUT
    mlp_ratio: int = 4
    # attention: GQA with 2 query heads per kv head; tanh softcap on the scores
    attn_heads_q: int = 2
    attn_heads_kv: int = 1
    attn_head_dim: int = 64
    attn_softcap: float = 20.0
    # gated delta rule: 2 value heads share 1 q/k head
    gdn_heads: int = 1
    gdn_value_heads: int = 2
    gdn_key_dim: int = 64
    gdn_value_dim: int = 64


def make_mixer(kind: str, config: ModelConfig) -> nn.Module:
    if kind == "attention":
        return AttentionMixer(config.d_model, config.attn_heads_q, config.attn_heads_kv,
                              config.attn_head_dim, config.attn_softcap)
    if kind in ("chunk_gdn", "recurrent_gdn"):
        return GatedDeltaMixer(config.d_model, config.gdn_heads, config.gdn_value_heads,
                               config.gdn_key_dim, config.gdn_value_dim, mode=kind.split("_")[0])
    raise ValueError(f"unknown layer kind {kind!r}: use attention, chunk_gdn or recurrent_gdn")


class Block(nn.Module):
    """Pre-norm residual block: x += mixer(norm(x)); x += mlp(norm(x))."""

    def __init__(self, kind: str, config: ModelConfig):
        super().__init__()
        self.mixer_norm = nn.RMSNorm(config.d_model, eps=1e-5)
        self.mixer = make_mixer(kind, config)
        self.mlp_norm = nn.RMSNorm(config.d_model, eps=1e-5)
        hidden = config.mlp_ratio * config.d_model
        self.mlp = nn.Sequential(nn.Linear(config.d_model, hidden), nn.GELU(),
                                 nn.Linear(hidden, config.d_model))

    def forward(self, x, kernels: Kernels, z_loss_weight: float):
        mixed, lse = self.mixer(self.mixer_norm(x), kernels, z_loss_weight)
        x = x + mixed
        x = x + self.mlp(self.mlp_norm(x))
        return x, lse


class HybridLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(kind, config) for kind in config.layout)
        self.final_norm = nn.RMSNorm(config.d_model, eps=1e-5)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor, kernels: Kernels, z_loss_weight: float = 0.0):
        """tokens [B, T] -> (logits [B, T, vocab], list of attention lse tensors [B, Hq, T])."""
        x = self.embed(tokens)
        lses = []
        for block in self.blocks:
            x, lse = block(x, kernels, z_loss_weight)
            if lse is not None:
                lses.append(lse)
        return self.head(self.final_norm(x)), lses


def language_model_loss(logits: torch.Tensor, targets: torch.Tensor, lses: list[torch.Tensor],
                        z_loss_weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(cross entropy, attention z-loss); the z-loss is (w/2) * mean(lse^2) summed over layers,
    whose gradient w * lse / n is the dLSE the attention backward receives."""
    cross_entropy = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    z_loss = logits.new_zeros(())
    for lse in lses:
        z_loss = z_loss + 0.5 * z_loss_weight * lse.float().pow(2).mean()
    return cross_entropy, z_loss
