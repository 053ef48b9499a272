"""B1 on wgmma (FLASHGRAD_CHUNKED_B1_WGMMA) and the wgmma stage 2 (FLASHGRAD_CHUNKED_STATE_WGMMA), session 17,
in bench/delta_rule_vs_fla.py's own configuration (its inputs, its timing, peak extra memory), one
process, the settings interleaved over rounds (keepab.compare). Prints ROW lines."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import keepab  # noqa: E402

B1, ST = "FLASHGRAD_CHUNKED_B1_WGMMA", "FLASHGRAD_CHUNKED_STATE_WGMMA"
keepab.compare([("mma", {B1: "0", ST: "0"}), ("default", {B1: None, ST: None}),
                ("both wgmma 32", {B1: "32", ST: "32"}), ("both wgmma 16", {B1: "16", ST: "16"})],
               cases=[("gdn", 1, 32768, 16, 128), ("gdn", 2, 16384, 16, 128)])
