"""A progress bar: tqdm when it is installed, else one line rewritten in place."""

from __future__ import annotations

import sys
import time


class _PlainBar:
    def __init__(self, total: int, desc: str):
        self.total, self.desc, self.count = total, desc, 0
        self.postfix = ""
        self.start = time.perf_counter()

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def update(self, n: int = 1) -> None:
        self.count += n
        width = 30
        filled = int(width * self.count / max(self.total, 1))
        elapsed = time.perf_counter() - self.start
        sys.stderr.write(f"\r{self.desc}: [{'#' * filled}{'.' * (width - filled)}] "
                         f"{self.count}/{self.total} {elapsed:5.1f}s {self.postfix}")
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()


def progress_bar(total: int, desc: str):
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _PlainBar(total, desc)
    return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)
