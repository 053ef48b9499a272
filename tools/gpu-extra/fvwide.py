"""The chunk states rebuilt from v_new by the wide kernels (session 15's default) against the chain
kernel (FLASHGRAD_CHUNKED_FROM_VNEW=chain) and against not keeping v_new, in
bench/delta_rule_vs_fla.py's own configuration, one process, the settings interleaved over rounds
(keepab.compare). Prints ROW lines: setting, fwd / bwd ms (median of rounds), peak MiB.
(Run 15.2 also timed pass 2 at 4 and 5 stages: no faster; retired.)"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import keepab  # noqa: E402

keepab.compare([("off", {"FLASHGRAD_KEEP_V_NEW": "0", "FLASHGRAD_CHUNKED_FROM_VNEW": None}),
                ("kept chain", {"FLASHGRAD_KEEP_V_NEW": "1", "FLASHGRAD_CHUNKED_FROM_VNEW": "chain"}),
                ("kept wide", {"FLASHGRAD_KEEP_V_NEW": "1", "FLASHGRAD_CHUNKED_FROM_VNEW": "wide"})])
