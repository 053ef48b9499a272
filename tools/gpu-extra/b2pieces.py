"""The split B2 in pieces on two streams (FLASHGRAD_CHUNKED_B2_PIECES, chunked_b2_pieces.h, session 16)
against the whole kernels, in bench/delta_rule_vs_fla.py's own configuration (its inputs, its timing,
peak extra memory), one process, the settings interleaved over rounds (keepab.compare). Prints ROW lines:
setting, fwd / bwd ms (median of rounds), peak MiB."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import keepab  # noqa: E402

PIECES = os.environ.get("B2PIECES_SETTINGS", "8,16,32").split(",")
keepab.compare([("whole", {"FLASHGRAD_CHUNKED_B2_PIECES": None})] +
               [(f"pieces {n}", {"FLASHGRAD_CHUNKED_B2_PIECES": n}) for n in PIECES])
