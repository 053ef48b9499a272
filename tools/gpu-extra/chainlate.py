"""The wgmma chains' order (FLASHGRAD_CHUNKED_CHAIN_LATE, session 18) in bench/delta_rule_vs_fla.py's own
configuration, one process, the settings interleaved over rounds (keepab.compare). Prints ROW lines."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import keepab  # noqa: E402

E = "FLASHGRAD_CHUNKED_CHAIN_LATE"
keepab.compare([("early (session 17)", {E: "0"}), ("late", {E: "1"})],
               cases=[("gdn", 1, 32768, 16, 128), ("gdn", 2, 16384, 16, 128)])
