"""`python -m flashgrad.demo.fp8_parity`: does FP8 attention train like bf16 attention?

Trains the same small causal transformer twice on the demo's text (flashgrad/data), with the
same seed (same initial weights, same batches): once with flashgrad.flash_attn_func in bf16 and
once with flashgrad.flash_attn_fp8_func (e4m3 forward and backward, docs/fp8.md). Writes the
per-step losses (CSV), their plot (PNG, when matplotlib is installed; otherwise an ASCII summary
on stdout) and a JSON summary, and prints the final losses and their relative difference.
Target (issue 7): the FP8 run ends within 2% of the bf16 run. Exit status 0 when it does, 1 when
it does not, 2 when the run cannot start.

The model: 4 pre-norm blocks of causal softmax attention (GQA 4 query / 2 kv heads of dim 64,
tanh softcap 20 as in the demo) and an MLP, learned positions, width 128; AdamW with warmup and
cosine decay. Everything but the attention kernel is the same PyTorch code in both runs.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn

from .kernels import Kernels
from .model import HybridLM, ModelConfig, language_model_loss
from .text_data import CharVocab, WindowSampler, load_text
from .train import TrainConfig, learning_rate

TARGET_RELATIVE_DIFFERENCE = 0.02
FINAL_WINDOW = 50  # steps averaged into the final training loss


class CausalTransformer(HybridLM):
    """The demo's model with attention in every block and learned absolute positions."""

    def __init__(self, config: ModelConfig, max_len: int):
        super().__init__(config)
        self.position = nn.Embedding(max_len, config.d_model)

    def forward(self, tokens: torch.Tensor, kernels: Kernels, z_loss_weight: float = 0.0):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        lses = []
        for block in self.blocks:
            x, lse = block(x, kernels, z_loss_weight)
            lses.append(lse)
        return self.head(self.final_norm(x)), lses


def _no_delta_rule(*args, **kwargs):
    raise RuntimeError("the parity model has no delta-rule layers")


def attention_op(fp8: bool, emulate: bool = False):
    """(name, fn(q, k, v, softcap) -> (out, lse)): flash_attn_func (bf16), flash_attn_fp8_func,
    or with emulate the recipe's plain-torch emulation; all fed bf16, causal."""
    import flashgrad
    if fp8 and emulate:
        from flashgrad.fp8_reference import fp8_attention_emulated
        return "fp8_attention_emulated", lambda q, k, v, softcap: fp8_attention_emulated(
            q, k, v, causal=True, softcap=softcap)
    op = flashgrad.flash_attn_fp8_func if fp8 else flashgrad.flash_attn_func
    return op.__name__, lambda q, k, v, softcap: op(q, k, v, causal=True, softcap=softcap, return_lse=True)


def attention_kernels(fp8: bool, emulate: bool = False) -> Kernels:
    """The parity model's kernel set; kernels.attention.calls counts the calls (proof of which
    op trained the model)."""
    name, op = attention_op(fp8, emulate)

    def attention(q, k, v, *, softcap, z_loss_weight=0.0):
        attention.calls += 1
        return op(q, k, v, softcap)

    attention.calls = 0
    attention.op_name = name
    label = "emulated-fp8" if fp8 and emulate else ("flashgrad-fp8" if fp8 else "flashgrad-bf16")
    return Kernels(label, attention, _no_delta_rule, _no_delta_rule, compute_dtype=torch.bfloat16,
                   returns_lse=True)


def attention_difference(fp8_name_and_op, bf16_name_and_op, device, seed) -> float:
    """Relative RMS difference between the two ops' outputs on one random input of the model's
    attention shape: ~1e-2 when the FP8 op really quantizes, 0 if it silently ran bf16."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v = (torch.randn(2, 256, h, 64, generator=g).to(device=device, dtype=torch.bfloat16)
               for h in (4, 2, 2))
    a = fp8_name_and_op[1](q, k, v, 20.0)[0].float()
    b = bf16_name_and_op[1](q, k, v, 20.0)[0].float()
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m flashgrad.demo.fp8_parity", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--z-loss-weight", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default cuda when visible; on the CPU flash_attn_fp8_func runs the CPU "
                             "reference (exact on the quantized inputs), useful only as a smoke test")
    parser.add_argument("--emulate", action="store_true",
                        help="the FP8 run uses the recipe's plain-torch emulation "
                             "(flashgrad.fp8_reference) instead of the kernels: a prediction where "
                             "the FP8 kernels are absent")
    parser.add_argument("--out", type=Path, default=Path("out/fp8_parity"))
    args = parser.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.steps < 2:
        parser.error("--steps must be at least 2")
    return args


def run(kernels: Kernels, args, tokens: torch.Tensor, vocab_size: int, device: torch.device) -> dict:
    """One training run; returns per-step losses, the held-out loss and the time taken."""
    split = int(0.9 * tokens.numel())
    config = ModelConfig(vocab_size=vocab_size, d_model=128, layout=("attention",) * 4,
                         attn_heads_q=4, attn_heads_kv=2, attn_head_dim=64, attn_softcap=20.0)
    train_config = TrainConfig(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                               lr=args.lr, z_loss_weight=args.z_loss_weight,
                               warmup_steps=max(1, args.steps // 10))
    torch.manual_seed(args.seed)                      # same initial weights in both runs
    model = CausalTransformer(config, args.seq_len).to(device)
    sampler = WindowSampler(tokens[:split], args.seq_len, args.batch_size, seed=args.seed)
    held_out = WindowSampler(tokens[split:], args.seq_len, args.batch_size, seed=args.seed + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
    losses = []
    start = time.perf_counter()
    model.train()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, train_config)
        inputs, targets = sampler.next_batch(device)
        logits, lses = model(inputs, kernels, args.z_loss_weight)
        cross_entropy, z_loss = language_model_loss(logits, targets, lses, args.z_loss_weight)
        optimizer.zero_grad(set_to_none=True)
        (cross_entropy + z_loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(cross_entropy.detach())
    losses = [float(x) for x in torch.stack(losses).cpu()]
    seconds = time.perf_counter() - start
    if not all(math.isfinite(x) for x in losses):
        raise FloatingPointError(f"{kernels.name}: the loss became non-finite at step "
                                 f"{next(i for i, x in enumerate(losses) if not math.isfinite(x))}")
    model.eval()
    with torch.no_grad():
        held = []
        for _ in range(8):
            inputs, targets = held_out.next_batch(device)
            logits, _ = model(inputs, kernels)
            held.append(float(language_model_loss(logits, targets, [], 0.0)[0]))
    window = min(FINAL_WINDOW, len(losses))
    return {"losses": losses, "final_train_loss": sum(losses[-window:]) / window,
            "held_out_loss": sum(held) / len(held), "seconds": seconds}


def write_csv(path: Path, runs: dict) -> None:
    names = list(runs)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step"] + [f"loss_{n}" for n in names])
        for step, row in enumerate(zip(*(runs[n]["losses"] for n in names))):
            writer.writerow([step] + [f"{x:.6f}" for x in row])


def _smooth(values, window):
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def write_plot(path: Path, runs: dict, title: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), dpi=120, sharex=True,
                                         gridspec_kw={"height_ratios": [3, 1]})
    window = max(1, len(next(iter(runs.values()))["losses"]) // 30)
    for color, (name, run) in zip(("C0", "C3"), runs.items()):
        top.plot(run["losses"], color=color, alpha=0.25, linewidth=0.7)
        top.plot(_smooth(run["losses"], window), color=color, linewidth=1.8,
                 label=f"{name} (final {run['final_train_loss']:.4f})")
    names = list(runs)
    a, b = (_smooth(runs[n]["losses"], window) for n in names)
    bottom.plot([100 * (y - x) / x for x, y in zip(a, b)], color="k", linewidth=1.2)
    bottom.axhline(0, color="0.6", linewidth=0.8)
    bottom.set_ylabel(f"{names[1]} - {names[0]} (%)")
    bottom.set_xlabel("step")
    top.set_ylabel("training loss (nats / character)")
    top.set_title(title, fontsize=9)
    top.legend()
    for axes in (top, bottom):
        axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return True


def ascii_summary(runs: dict, points: int = 10) -> str:
    names = list(runs)
    steps = len(runs[names[0]]["losses"])
    lines = ["step   " + "  ".join(f"{n:>15}" for n in names)]
    for i in range(points + 1):
        s = min(steps - 1, round(i * (steps - 1) / points))
        lo, hi = max(0, s - 5), min(steps, s + 6)   # an 11-step mean around the step
        lines.append(f"{s:5d}  " + "  ".join(
            f"{sum(runs[n]['losses'][lo:hi]) / (hi - lo):15.4f}" for n in names))
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    try:
        import flashgrad
        kernels = {"bf16": attention_kernels(fp8=False),
                   "fp8": attention_kernels(fp8=True, emulate=args.emulate)}
        if device.type == "cuda" and not flashgrad.build_info()["cuda"]:
            raise RuntimeError("flashgrad was built without its CUDA backend")
    except (ImportError, AttributeError, RuntimeError) as error:
        print(f"fp8_parity: cannot start: {error}", file=sys.stderr)
        return 2
    text = load_text()
    vocab = CharVocab(text)
    tokens = vocab.encode(text)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        probe = attention_difference(attention_op(True, args.emulate), attention_op(False), device, args.seed)
    except NotImplementedError as error:
        print(f"fp8_parity: the fp8 run cannot execute: {error}", file=sys.stderr)
        return 2
    print(f"one attention call, fp8 vs bf16 output on random inputs: relative RMS difference {probe:.2e} "
          f"({kernels['fp8'].attention.op_name} vs {kernels['bf16'].attention.op_name})")
    runs = {}
    for name, k in kernels.items():
        try:
            runs[name] = run(k, args, tokens, len(vocab), device)
        except NotImplementedError as error:   # e.g. no FP8 kernels in this CUDA build
            print(f"fp8_parity: the {name} run cannot execute: {error}", file=sys.stderr)
            return 2
        except FloatingPointError as error:
            print(f"fp8 vs bf16: FAIL: {error}")
            return 1
        runs[name]["attention_calls"] = k.attention.calls
        print(f"{name}: {args.steps} steps in {runs[name]['seconds']:.1f} s, {k.attention.calls} calls of "
              f"{k.attention.op_name} on {device}; final training loss (mean of last "
              f"{min(FINAL_WINDOW, args.steps)}) {runs[name]['final_train_loss']:.6f}, "
              f"held-out {runs[name]['held_out_loss']:.6f}")
    bf16, fp8 = runs["bf16"], runs["fp8"]
    step_differences = [abs(a - b) for a, b in zip(fp8["losses"], bf16["losses"])]
    print(f"per-step |loss fp8 - loss bf16|: step 0 {step_differences[0]:.2e} (same weights and batch: "
          f"attention precision only), max {max(step_differences):.2e}, mean "
          f"{sum(step_differences) / len(step_differences):.2e}")
    rel_train = (fp8["final_train_loss"] - bf16["final_train_loss"]) / bf16["final_train_loss"]
    rel_held = (fp8["held_out_loss"] - bf16["held_out_loss"]) / bf16["held_out_loss"]
    passed = abs(rel_train) <= TARGET_RELATIVE_DIFFERENCE and abs(rel_held) <= TARGET_RELATIVE_DIFFERENCE
    csv_path, png_path = args.out / "fp8_parity.csv", args.out / "fp8_parity.png"
    write_csv(csv_path, runs)
    fp8_name = "emulated fp8 recipe" if args.emulate else "flash_attn_fp8_func"
    title = (f"{fp8_name} vs flash_attn_func (bf16), seed {args.seed}, {device}: "
             f"4 attention blocks, B{args.batch_size} T{args.seq_len}")
    plotted = write_plot(png_path, runs, title)
    summary = {"steps": args.steps, "batch_size": args.batch_size, "seq_len": args.seq_len,
               "seed": args.seed, "device": str(device), "fp8": fp8_name,
               "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               **{f"{n}_{key}": runs[n][key] for n in runs
                  for key in ("final_train_loss", "held_out_loss", "seconds")},
               "relative_difference_train": rel_train, "relative_difference_held_out": rel_held,
               "target": TARGET_RELATIVE_DIFFERENCE, "passed": passed,
               "attention_output_difference_random_inputs": probe,
               "attention_calls": {n: runs[n]["attention_calls"] for n in runs},
               "step0_loss_difference": step_differences[0], "max_step_loss_difference": max(step_differences)}
    (args.out / "fp8_parity.json").write_text(json.dumps(summary, indent=2) + "\n")
    if not plotted:
        print("matplotlib is not installed: no PNG; the loss curves (11-step means):")
        print(ascii_summary(runs))
    print(f"fp8 vs bf16: final training loss {fp8['final_train_loss']:.6f} vs {bf16['final_train_loss']:.6f} "
          f"({100 * rel_train:+.3f}%), held-out {fp8['held_out_loss']:.6f} vs {bf16['held_out_loss']:.6f} "
          f"({100 * rel_held:+.3f}%); target within {100 * TARGET_RELATIVE_DIFFERENCE:.0f}%: "
          f"{'PASS' if passed else 'FAIL'}")
    print(f"wrote {csv_path}" + (f", {png_path}" if plotted else "") + f", {args.out / 'fp8_parity.json'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
