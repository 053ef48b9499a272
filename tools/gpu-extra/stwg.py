"""The serial chains without k's row norms (stage 1's row scales, FLASHGRAD_CHUNKED_COLSCALE=0 turns them
off) and chunked stage 2 on wgmma (FLASHGRAD_CHUNKED_STATE_WGMMA, chunked_state_wgmma.cuh), session 16,
in bench/delta_rule_vs_fla.py's own configuration (its inputs, its timing, peak extra memory), one
process, the settings interleaved over rounds (keepab.compare). Prints ROW lines."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import keepab  # noqa: E402

E, CS = "FLASHGRAD_CHUNKED_STATE_WGMMA", "FLASHGRAD_CHUNKED_COLSCALE"
keepab.compare([("default", {E: None, CS: None}), ("colscale off", {E: None, CS: "0"}),
                ("wgmma 32", {E: "32", CS: None})],
               cases=[("gdn", 1, 32768, 16, 128), ("gdn", 8, 4096, 16, 64), ("gdn", 8, 4096, 16, 128)])
