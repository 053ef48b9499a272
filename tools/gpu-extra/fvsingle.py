"""The states rebuilt from v_new with single-fragment products (session 14; the default since run 14.3,
FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS=split gives hi + lo; in run 14.3 "single" selected them) against hi + lo and against not keeping v_new, in bench/delta_rule_vs_fla.py's own
configuration (its inputs and timing, as keepab.py), in one process, the settings interleaved over
rounds. Prints ROW lines: setting, fwd / bwd ms (median of rounds), peak MiB."""
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import delta_rule_vs_fla as bench  # noqa: E402

CASES = [("gdn", 1, 32768, 16, 128), ("gdn", 8, 4096, 16, 128)]
SETTINGS = [("off", {"FLASHGRAD_KEEP_V_NEW": "0"}),
            ("kept hi+lo", {"FLASHGRAD_KEEP_V_NEW": "1", "FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS": "split"}),
            ("kept single", {"FLASHGRAD_KEEP_V_NEW": "1", "FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS": "single"})]
for kind, B, T, H, K in CASES:
    inputs = bench.make_inputs(kind, B, T, H, K)
    fn = bench.flashgrad_fn(kind, "chunk")
    res = {s: [] for s, _ in SETTINGS}
    for _ in range(3):
        for label, env in SETTINGS:
            for name, value in env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            res[label].append(bench.measure(fn, inputs))
    for label, _ in SETTINGS:
        f = statistics.median(r[0] for r in res[label])
        b = statistics.median(r[1] for r in res[label])
        p = max(r[2] for r in res[label])
        print(f"ROW {kind} B{B} T{T}: {label}: forward {f:.3f} ms, backward {b:.3f} ms, peak {p:.0f} MiB "
              f"(rounds: bwd {', '.join(f'{r[1]:.3f}' for r in res[label])})", flush=True)
