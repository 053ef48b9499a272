"""Kept v_new on vs off in bench/delta_rule_vs_fla.py's own configuration (its inputs, its timing:
backward = (forward + backward) - forward, peak extra memory), in one process, the two settings
interleaved over rounds: run 13.3's deltabench read B1 T32768 backward 4.152 ms with v_new kept by
default where run 12.3 read 4.055 without, while keepvnew.sh's same-process A/B (l2 norm on, its own
timing) read 4.579 -> 4.388. Prints ROW lines: setting, fwd / bwd ms (median of rounds), peak MiB.
compare(settings) is the A/B of any environment settings (fvsingle.py uses it)."""
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import delta_rule_vs_fla as bench  # noqa: E402

CASES = [("gdn", 1, 32768, 16, 128), ("gdn", 8, 4096, 16, 128)]
SETTINGS = [("off", {"FLASHGRAD_KEEP_V_NEW": "0"}), ("kept", {"FLASHGRAD_KEEP_V_NEW": "1"})]


def compare(settings, cases=CASES, rounds=3):
    """settings: [(label, {NAME: value or None (unset)})], applied in turn each round (the launchers
    read them at every call)."""
    for kind, B, T, H, K in cases:
        inputs = bench.make_inputs(kind, B, T, H, K)
        fn = bench.flashgrad_fn(kind, "chunk")
        res = {s: [] for s, _ in settings}
        for _ in range(rounds):
            for label, env in settings:
                for name, value in env.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
                res[label].append(bench.measure(fn, inputs))
        for label, _ in settings:
            f = statistics.median(r[0] for r in res[label])
            b = statistics.median(r[1] for r in res[label])
            p = max(r[2] for r in res[label])
            print(f"ROW {kind} B{B} T{T}: {label}: forward {f:.3f} ms, backward {b:.3f} ms, peak {p:.0f} MiB "
                  f"(rounds: bwd {', '.join(f'{r[1]:.3f}' for r in res[label])})", flush=True)


if __name__ == "__main__":
    compare(SETTINGS)
