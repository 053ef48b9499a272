"""The states rebuilt from v_new with single-fragment products (session 14; the default since run 14.3,
FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS=split gives hi + lo; in run 14.3 "single" selected them) against
hi + lo and against not keeping v_new, in bench/delta_rule_vs_fla.py's own configuration, one process,
the settings interleaved over rounds (keepab.compare). Prints ROW lines: setting, fwd / bwd ms (median
of rounds), peak MiB."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import keepab  # noqa: E402

keepab.compare([("off", {"FLASHGRAD_KEEP_V_NEW": "0"}),
                ("kept hi+lo", {"FLASHGRAD_KEEP_V_NEW": "1", "FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS": "split"}),
                ("kept single", {"FLASHGRAD_KEEP_V_NEW": "1", "FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS": "single"})])
