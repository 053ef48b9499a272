"""Kept v_new on vs off in bench/delta_rule_vs_fla.py's own configuration (its inputs, its timing:
backward = (forward + backward) - forward, peak extra memory), in one process, the two settings
interleaved over rounds: run 13.3's deltabench read B1 T32768 backward 4.152 ms with v_new kept by
default where run 12.3 read 4.055 without, while keepvnew.sh's same-process A/B (l2 norm on, its own
timing) read 4.579 -> 4.388. Prints ROW lines: setting, fwd / bwd ms (median of rounds), peak MiB."""
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import delta_rule_vs_fla as bench  # noqa: E402

CASES = [("gdn", 1, 32768, 16, 128), ("gdn", 8, 4096, 16, 128)]
SETTINGS = [("off", "0"), ("kept", "1")]
for kind, B, T, H, K in CASES:
    inputs = bench.make_inputs(kind, B, T, H, K)
    fn = bench.flashgrad_fn(kind, "chunk")
    res = {s: [] for s, _ in SETTINGS}
    for _ in range(3):
        for label, value in SETTINGS:
            os.environ["FLASHGRAD_KEEP_V_NEW"] = value
            res[label].append(bench.measure(fn, inputs))
    for label, _ in SETTINGS:
        f = statistics.median(r[0] for r in res[label])
        b = statistics.median(r[1] for r in res[label])
        p = max(r[2] for r in res[label])
        print(f"ROW {kind} B{B} T{T}: {label}: forward {f:.3f} ms, backward {b:.3f} ms, peak {p:.0f} MiB "
              f"(rounds: bwd {', '.join(f'{r[1]:.3f}' for r in res[label])})", flush=True)
