"""The training loop, held-out evaluation and sampling."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from .kernels import Kernels
from .model import HybridLM, language_model_loss
from .progress import progress_bar
from .text_data import CharVocab, WindowSampler


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int
    seq_len: int
    lr: float
    z_loss_weight: float
    warmup_steps: int
    weight_decay: float = 0.01
    grad_clip: float = 1.0


def learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak at the last step."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(config.steps - config.warmup_steps, 1)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(model: HybridLM, kernels: Kernels, sampler: WindowSampler, config: TrainConfig,
          device: torch.device) -> list[dict]:
    """Runs config.steps optimizer steps; returns one record per step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr,
                                  weight_decay=config.weight_decay, betas=(0.9, 0.95))
    tokens_per_step = config.batch_size * config.seq_len
    history = []
    bar = progress_bar(config.steps, desc=f"training ({kernels.name})")
    model.train()
    for step in range(config.steps):
        start = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        inputs, targets = sampler.next_batch(device)
        logits, lses = model(inputs, kernels, config.z_loss_weight)
        cross_entropy, z_loss = language_model_loss(logits, targets, lses, config.z_loss_weight)
        optimizer.zero_grad(set_to_none=True)
        (cross_entropy + z_loss).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        _synchronize(device)
        seconds = time.perf_counter() - start

        record = {"step": step, "loss": cross_entropy.item(), "z_loss": z_loss.item(),
                  "grad_norm": float(grad_norm), "lr": learning_rate(step, config),
                  "seconds": seconds, "tokens_per_s": tokens_per_step / seconds}
        if not math.isfinite(record["loss"]):
            bar.close()
            raise FloatingPointError(f"loss is {record['loss']} at step {step}")
        history.append(record)
        bar.set_postfix_str(f"loss {record['loss']:.3f}  {record['tokens_per_s']:,.0f} tok/s")
        bar.update(1)
    bar.close()
    return history


@torch.no_grad()
def evaluate(model: HybridLM, kernels: Kernels, sampler: WindowSampler, batches: int,
             device: torch.device) -> float:
    """Mean cross entropy (nats per character) over a few held-out batches."""
    model.eval()
    total = 0.0
    for _ in range(batches):
        inputs, targets = sampler.next_batch(device)
        logits, lses = model(inputs, kernels)
        total += float(language_model_loss(logits, targets, lses, 0.0)[0])
    return total / batches


@torch.no_grad()
def sample_text(model: HybridLM, kernels: Kernels, vocab: CharVocab, prompt: str, length: int,
                context: int, temperature: float, device: torch.device, seed: int) -> str:
    """Generates length characters after prompt, re-reading the last `context` characters each
    step (the model keeps no cache: the demo is about training)."""
    model.eval()
    generator = torch.Generator(device="cpu").manual_seed(seed)
    ids = vocab.encode(prompt).tolist()
    for _ in range(length):
        window = torch.tensor([ids[-context:]], dtype=torch.long, device=device)
        logits, _ = model(window, kernels)
        probs = torch.softmax(logits[0, -1].float().cpu() / temperature, dim=-1)
        ids.append(int(torch.multinomial(probs, 1, generator=generator)))
    return vocab.decode(ids)
