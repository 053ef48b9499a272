"""`python -m flashgrad.demo`: check, train, report and sample, in that order."""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time
from pathlib import Path

import torch

from .gradient_check import format_table, run_gradient_check
from .kernels import KernelsUnavailable, flashgrad_kernels, reference_kernels
from .model import HybridLM, ModelConfig
from .report import save_json, save_loss_curve
from .text_data import CharVocab, WindowSampler, load_text
from .train import TrainConfig, evaluate, sample_text, train

QUICK_STEPS = 25  # --quick: enough for the loss to leave its starting value, a few seconds on a CPU


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m flashgrad.demo",
        description="Train a tiny character-level hybrid language model (gated delta rule and "
                    "softmax attention layers) with flashgrad's kernels.")
    parser.add_argument("--steps", type=int, default=None,
                        help="optimizer steps (default 250, or %d with --quick)" % QUICK_STEPS)
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default: cuda when a GPU is visible, else cpu")
    parser.add_argument("--fp8", action="store_true",
                        help="fp8 attention (flashgrad.flash_attn_fp8_func; GPU only)")
    parser.add_argument("--out", type=Path, default=Path("out/demo"),
                        help="output folder for loss_curve.png and log.json (default out/demo)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="a short run for tests: %d steps, a short sample" % QUICK_STEPS)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=4e-3)
    parser.add_argument("--z-loss-weight", type=float, default=1e-3,
                        help="weight w of the attention z-loss (w/2) * mean(lse^2)")
    parser.add_argument("--sample-chars", type=int, default=None,
                        help="characters to sample at the end (default 200, 60 with --quick)")
    parser.add_argument("--text", type=Path, default=None,
                        help="train on this UTF-8 file instead of the shipped text")
    parser.add_argument("--kernels", choices=("flashgrad", "torch"), default="flashgrad",
                        help="'torch' runs the plain PyTorch references instead of flashgrad "
                             "(a baseline; the gradient check then compares them with themselves)")
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = QUICK_STEPS if args.quick else 250
    if args.sample_chars is None:
        args.sample_chars = 60 if args.quick else 200
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    elif args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible to PyTorch")
    if args.fp8 and args.kernels == "torch":
        parser.error("--fp8 needs --kernels flashgrad")
    return args


def _flashgrad_version() -> str | None:
    try:
        import flashgrad
    except ImportError:
        return None
    return getattr(flashgrad, "__version__", "unknown")


def _describe_run(args, argv, kernels, device, model_config, train_config, parameters) -> dict:
    """The head of log.json: what ran, where, with which settings."""
    return {"command": " ".join(["python -m flashgrad.demo"] + list(argv if argv is not None
                                                                     else sys.argv[1:])),
            "flashgrad_version": _flashgrad_version(), "torch_version": torch.__version__,
            "platform": platform.platform(), "device": str(device),
            "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                            else platform.processor() or platform.machine()),
            "torch_threads": torch.get_num_threads(),
            "kernels": kernels.name, "compute_dtype": str(kernels.compute_dtype),
            "model": dataclasses.asdict(model_config), "train": dataclasses.asdict(train_config),
            "seed": args.seed, "parameters": parameters}


def _check_gradients(model_config, kernels, args, device, log: dict) -> bool:
    print("\ngradient check: each layer type against its plain PyTorch twin "
          "(relative error max|a-b| / max|b|)")
    checks = run_gradient_check(model_config, kernels, batch=2, steps=args.seq_len,
                                device=device, seed=args.seed + 1000)
    print(format_table(checks))
    passed = all(c.passed for c in checks)
    log["gradient_check"] = {"passed": passed, "layers": [c.as_dict() for c in checks]}
    if not passed:
        failed = ", ".join(c.layer for c in checks if not c.passed)
        print(f"\nflashgrad demo: GRADIENT CHECK FAILED for {failed}: flashgrad's gradients do "
              f"not match the plain PyTorch layer. Not training.", file=sys.stderr)
    else:
        print("gradient check passed\n")
    return passed


def _prompt_for(vocab: CharVocab, text: str) -> str:
    prompt = "And God said"  # a line opening that Genesis uses often
    return prompt if all(c in vocab.index for c in prompt) else text[:12]


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    log_path, curve_path = args.out / "log.json", args.out / "loss_curve.png"

    try:
        kernels = (reference_kernels() if args.kernels == "torch"
                   else flashgrad_kernels(device, fp8=args.fp8))
    except KernelsUnavailable as error:
        print(f"flashgrad demo: {error}", file=sys.stderr)
        return 2

    text = load_text(args.text)
    vocab = CharVocab(text)
    tokens = vocab.encode(text)
    split = int(0.9 * tokens.numel())  # the last tenth is held out for the start/end evaluation
    train_sampler = WindowSampler(tokens[:split], args.seq_len, args.batch_size, seed=args.seed)
    held_out = WindowSampler(tokens[split:], args.seq_len, args.batch_size, seed=args.seed + 1)

    model_config = ModelConfig(vocab_size=len(vocab))
    train_config = TrainConfig(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                               lr=args.lr, z_loss_weight=args.z_loss_weight,
                               warmup_steps=max(1, min(20, args.steps // 10)))
    model = HybridLM(model_config).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"flashgrad demo: {len(text):,} characters, vocabulary {len(vocab)}, "
          f"layers {' / '.join(model_config.layout)}, {parameters:,} parameters")
    print(f"kernels {kernels.name} ({kernels.compute_dtype}), device {device}, "
          f"torch threads {torch.get_num_threads()}")
    log = _describe_run(args, argv, kernels, device, model_config, train_config, parameters)

    if not _check_gradients(model_config, kernels, args, device, log):
        save_json(log, log_path)
        print(f"log: {log_path}", file=sys.stderr)
        return 1

    loss_start = evaluate(model, kernels, held_out, batches=4, device=device)
    history = train(model, kernels, train_sampler, train_config, device)
    loss_end = evaluate(model, kernels, held_out, batches=4, device=device)
    train_seconds = sum(r["seconds"] for r in history)
    tokens_per_s = args.batch_size * args.seq_len * len(history) / train_seconds
    window = max(1, min(10, len(history) // 2))
    first = sum(r["loss"] for r in history[:window]) / window
    last = sum(r["loss"] for r in history[-window:]) / window
    print(f"held-out loss {loss_start:.3f} -> {loss_end:.3f} nats/char; training loss "
          f"(mean of {window} steps) {first:.3f} -> {last:.3f}; "
          f"{train_seconds:.1f} s, {tokens_per_s:,.0f} tokens/s")

    prompt = _prompt_for(vocab, text)
    sample = sample_text(model, kernels, vocab, prompt, args.sample_chars, context=args.seq_len,
                         temperature=0.8, device=device, seed=args.seed)
    print(f"\nsample ({args.sample_chars} characters after the prompt {prompt!r}):\n{sample}\n")

    wrote_curve = save_loss_curve(history, curve_path,
                                  f"{kernels.name} on {device}: {' / '.join(model_config.layout)}")
    log.update({"steps": history, "held_out_loss_start": loss_start, "held_out_loss_end": loss_end,
                "train_seconds": train_seconds, "tokens_per_s": tokens_per_s,
                "sample_prompt": prompt, "sample": sample,
                "loss_curve": str(curve_path) if wrote_curve else None,
                "total_seconds": time.perf_counter() - started})
    save_json(log, log_path)
    print(f"wrote {log_path}" + (f" and {curve_path}" if wrote_curve
                                 else " (no loss curve: matplotlib is not installed)"))
    return 0
