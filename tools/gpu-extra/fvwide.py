"""The chunk states rebuilt from v_new by the wide kernels (session 15's default) at 3 / 4 / 5 stages
(FLASHGRAD_CHUNKED_FROM_VNEW_WIDE_STAGES) against the chain kernel (FLASHGRAD_CHUNKED_FROM_VNEW=chain),
v_new kept, in bench/delta_rule_vs_fla.py's own configuration, one process, the settings interleaved
over rounds (keepab.compare). Prints ROW lines: setting, fwd / bwd ms (median of rounds), peak MiB."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import keepab  # noqa: E402

S = "FLASHGRAD_CHUNKED_FROM_VNEW_WIDE_STAGES"
keepab.compare([("kept chain", {"FLASHGRAD_KEEP_V_NEW": "1", "FLASHGRAD_CHUNKED_FROM_VNEW": "chain", S: None}),
                ("kept wide s3", {"FLASHGRAD_KEEP_V_NEW": "1", "FLASHGRAD_CHUNKED_FROM_VNEW": "wide", S: "3"}),
                ("kept wide s4", {"FLASHGRAD_KEEP_V_NEW": "1", "FLASHGRAD_CHUNKED_FROM_VNEW": "wide", S: "4"}),
                ("kept wide s5", {"FLASHGRAD_KEEP_V_NEW": "1", "FLASHGRAD_CHUNKED_FROM_VNEW": "wide", S: "5"})])
