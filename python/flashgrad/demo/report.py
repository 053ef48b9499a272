"""What the demo leaves in its output folder: the loss curve (PNG) and the run's log (JSON)."""

from __future__ import annotations

import json
from pathlib import Path


def _moving_average(values: list[float], window: int) -> list[float]:
    averaged, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        averaged.append(total / min(i + 1, window))
    return averaged


def save_loss_curve(history: list[dict], path: Path, title: str) -> bool:
    """Writes the per-step cross entropy and its moving average; False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    steps = [r["step"] for r in history]
    losses = [r["loss"] for r in history]
    figure, axes = plt.subplots(figsize=(7, 4), dpi=120)
    axes.plot(steps, losses, color="0.7", linewidth=0.8, label="cross entropy per step")
    window = max(1, len(losses) // 20)
    axes.plot(steps, _moving_average(losses, window), color="C0", linewidth=1.8,
              label=f"moving average ({window} steps)")
    axes.set_xlabel("step")
    axes.set_ylabel("loss (nats / character)")
    axes.set_title(title, fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return True


def save_json(log: dict, path: Path) -> None:
    path.write_text(json.dumps(log, indent=2) + "\n", encoding="utf-8")
