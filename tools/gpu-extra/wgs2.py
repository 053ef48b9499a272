"""The wgmma chains with two warpgroups (FLASHGRAD_CHUNKED_B1_WGMMA_WGS, FLASHGRAD_CHUNKED_STATE_WGMMA_WGS;
session 18) in bench/delta_rule_vs_fla.py's own configuration, one process, the settings interleaved over
rounds (keepab.compare). Prints ROW lines."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import keepab  # noqa: E402

B1, ST = "FLASHGRAD_CHUNKED_B1_WGMMA_WGS", "FLASHGRAD_CHUNKED_STATE_WGMMA_WGS"
keepab.compare([("one warpgroup", {B1: "1", ST: "1"}), ("two warpgroups", {B1: "2", ST: "2"}),
                ("B1 two only", {B1: "2", ST: "1"})],
               cases=[("gdn", 1, 32768, 16, 128), ("gdn", 2, 16384, 16, 128)])
