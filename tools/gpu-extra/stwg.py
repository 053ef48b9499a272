"""Chunked stage 2 on wgmma (FLASHGRAD_CHUNKED_STATE_WGMMA, chunked_state_wgmma.cuh, session 16) against the
mma.sync kernels, in bench/delta_rule_vs_fla.py's own configuration (its inputs, its timing, peak extra
memory), one process, the settings interleaved over rounds (keepab.compare). Prints ROW lines."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import keepab  # noqa: E402

E = "FLASHGRAD_CHUNKED_STATE_WGMMA"
keepab.compare([("default", {E: None}), ("wgmma 64", {E: "64"}), ("wgmma 32", {E: "32"})],
               cases=[("gdn", 1, 32768, 16, 128), ("gdn", 8, 4096, 16, 64)])
