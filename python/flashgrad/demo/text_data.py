"""The shipped training text, its character vocabulary and random training windows."""

from __future__ import annotations

from pathlib import Path

import torch

TEXT_NAME = "genesis_kjv.txt"  # public domain; see flashgrad/data/README.md


def load_text(path: str | Path | None = None) -> str:
    if path is not None:
        return Path(path).read_text(encoding="utf-8")
    # The text ships inside the package, beside this subpackage: flashgrad/data/.
    return (Path(__file__).resolve().parent.parent / "data" / TEXT_NAME).read_text(encoding="utf-8")


class CharVocab:
    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.index[c] for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


class WindowSampler:
    """Random windows of seq_len + 1 tokens: inputs are the first seq_len, targets the last."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, batch_size: int, seed: int):
        assert tokens.numel() > seq_len + 1, "the text is shorter than one training window"
        self.tokens, self.seq_len, self.batch_size = tokens, seq_len, batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def next_batch(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, self.tokens.numel() - self.seq_len - 1, (self.batch_size,),
                               generator=self.generator)
        offsets = torch.arange(self.seq_len + 1)
        windows = self.tokens[starts[:, None] + offsets[None, :]]
        return windows[:, :-1].to(device), windows[:, 1:].to(device)
