"""Issue 6's benchmark rows over the sessions: flashgrad beside fla, from the committed run records.

Reads every table of bench/delta_rule_vs_fla.py's output committed under bench/results/ (the rows
"| chunk GDN | 8 4096 16 128 | <flashgrad fwd> | <fla fwd> | ... | <flashgrad bwd> | <fla bwd> | ..."
that deltabench.sh and gpu-check's bench step print, in session*_runs_h200.md and the older per-run
files), names each by its session and run (the "## Run X.Y" heading above it, else the file name),
and draws, per benchmark row of the issue, the same-process speed ratio fla / flashgrad for the forward
and the backward over the runs, with the issue's minimum (1.5x) and parity (1x); the recurrent row
plots flashgrad's backward / forward time against its 3x bound. A second panel per chunked row gives
the absolute times. Writes a PNG and a markdown table of the latest run per session.

usage: python3 bench/delta_rule_history.py [--results bench/results] [--out bench/results/delta_rule_history]
(needs matplotlib; no GPU, no flashgrad import.)
"""
import argparse
import glob
import os
import re

ROWS = [  # (key, title, the forward / backward targets in ms, or None)
    ("b8", "chunk GDN B8 T4096 H16 K=V=128", (0.30, 1.0)),
    ("t32k", "chunk GDN B1 T32768 H16 K=V=128", None),
    ("k64", "chunk GDN B8 T4096 H16 K=V=64", None),
    ("kda", "chunk KDA B4 T4096 H16", (0.45, 1.6)),
    ("rec", "recurrent GDN B4 T4096 H16", None),
]


def row_key(case, shape):
    """Which of the issue's rows a table line is (None: another case)."""
    text = f"{case} {shape}"
    if "KDA" in text:
        return "kda"
    if "recurrent" in text:
        return "rec"
    if "GDN" not in text and "gdn" not in text:
        return None
    if "K=V=64" in text or re.search(r"\b64\s*$", shape.strip()) or re.search(r"\bK(=V)?=?64\b", text):
        return "k64"
    if "32768" in text:
        return "t32k"
    return "b8"


def number(cell):
    m = re.match(r"\s*([0-9]+\.[0-9]+|[0-9]+)\s*$", cell.replace("*", ""))  # (bold cells: **2.723**)
    return float(m.group(1)) if m else None


def session_of(path):
    """(session, run within it or None) from a file name: session20_runs_h200.md -> (20, None),
    delta_rule_session20_run3.md -> (20, 3), delta_rule_h200_run3_chunked_vs_fla.md -> (3, None)."""
    name = os.path.basename(path)
    m = re.search(r"session(\d+)", name)
    if m:
        r = re.search(r"session\d+_run(\d+)", name)
        return int(m.group(1)), (int(r.group(1)) if r else None)
    m = re.search(r"_run(\d+)_", name)  # delta_rule_h200_run3_...: the session-3 run 3 (no run numbering then)
    return (int(m.group(1)) if m else 0), None


def tables(path):
    """(run label, {row key: (fg fwd, fla fwd, fg bwd, fla bwd)}) for each benchmark table in a file."""
    header, out, cur = None, [], None
    sess, file_run = session_of(path)
    run = f"{sess}.{file_run}" if file_run is not None else None
    for line in open(path, encoding="utf-8"):
        h = re.match(r"#+\s.*?\b[Rr]un (\d+(?:\.\d+)?)", line)
        if h:
            run = h.group(1)
            continue
        if not line.startswith("|"):
            header, cur = None, None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "flashgrad fwd" in cells and "fla fwd" in cells and "flashgrad bwd" in cells:
            header = {name: i for i, name in enumerate(cells)}
            label = run if run and "." in run else (f"{sess}.{run}" if run else str(sess))
            cur = (sess, label, {})
            out.append(cur)
            continue
        if header is None or cur is None or set(cells[0]) <= set("-: "):
            continue
        shape = cells[header["B T H K"]] if "B T H K" in header else ""
        key = row_key(cells[0], shape)
        if key is None:
            continue
        get = lambda name: number(cells[header[name]]) if name in header and header[name] < len(cells) else None
        cur[2].setdefault(key, (get("flashgrad fwd"), get("fla fwd"), get("flashgrad bwd"), get("fla bwd")))
    return [t for t in out if t[2]]


def collect(results):
    seen, runs = set(), []
    for path in sorted(glob.glob(os.path.join(results, "*.md"))):
        for sess, label, rows in tables(path):
            if (sess, label) in seen:  # the same run's table copied into a second file
                continue
            seen.add((sess, label))
            runs.append((sess, label, rows))

    def order(r):
        parts = re.findall(r"\d+", r[1])
        return (r[0], [int(p) for p in parts] if parts else [0])

    runs.sort(key=order)
    return runs


def ratio(a, b):
    return a / b if a and b else None


def plot(runs, out_png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(ROWS), 2, figsize=(15, 3.2 * len(ROWS)), squeeze=False)
    for i, (key, title, targets) in enumerate(ROWS):
        pts = [(r[1], r[2][key]) for r in runs if key in r[2]]
        x = list(range(len(pts)))
        labels = [p[0] for p in pts]
        ax, ax2 = axes[i]
        if key == "rec":
            y = [ratio(v[2], v[0]) for _, v in pts]
            ax.plot(x, y, "o-", label="flashgrad backward / forward time")
            ax.axhline(3.0, color="red", ls="--", lw=1, label="issue bound (<= 3x)")
            ax.set_ylabel("bwd / fwd")
        else:
            ax.plot(x, [ratio(v[1], v[0]) for _, v in pts], "o-", label="forward: fla / flashgrad")
            ax.plot(x, [ratio(v[3], v[2]) for _, v in pts], "s-", label="backward: fla / flashgrad")
            ax.axhline(1.5, color="red", ls="--", lw=1, label="issue minimum (1.5x)")
            ax.axhline(1.0, color="gray", ls=":", lw=1, label="parity")
            ax.set_ylabel("speed ratio (same process)")
        ax.set_title(title, fontsize=10)
        ax2.plot(x, [v[0] for _, v in pts], "o-", label="flashgrad fwd")
        ax2.plot(x, [v[2] for _, v in pts], "s-", label="flashgrad bwd")
        if key != "rec":
            ax2.plot(x, [v[1] for _, v in pts], "o:", alpha=0.6, label="fla fwd")
            ax2.plot(x, [v[3] for _, v in pts], "s:", alpha=0.6, label="fla bwd")
        if targets:
            ax2.axhline(targets[0], color="C0", ls="--", lw=1, label=f"target fwd {targets[0]} ms")
            ax2.axhline(targets[1], color="C1", ls="--", lw=1, label=f"target bwd {targets[1]} ms")
        ax2.set_ylabel("ms")
        ax2.set_yscale("log")
        ax2.set_title(title + " (times)", fontsize=10)
        for a in (ax, ax2):
            a.set_xticks(x)
            a.set_xticklabels(labels, rotation=90, fontsize=7)
            a.grid(alpha=0.3)
            a.legend(fontsize=7, loc="best")
    fig.suptitle("Issue 6: flashgrad beside fla-core 0.5.2 on one H200, by run (bench/results)", fontsize=12)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)


def latest_table(runs):
    """Markdown: the last run of each session, every row as fwd / bwd ms and fla / flashgrad."""
    last = {}
    for r in runs:  # the session's last run whose B8 row has all four times, else its last
        complete = all(t is not None for t in r[2].get("b8", (None,)))
        if complete or r[0] not in last or not all(t is not None for t in last[r[0]][2].get("b8", (None,))):
            last[r[0]] = r
    lines = ["| session (run) | " + " | ".join(t for _, t, _ in ROWS) + " |", "|---" * (len(ROWS) + 1) + "|"]
    for sess in sorted(last):
        _, label, rows = last[sess]
        cells = []
        for key, _, _ in ROWS:
            v = rows.get(key)
            if not v or v[0] is None:
                cells.append("-")
            elif key == "rec":
                cells.append(f"{v[0]:.3f} / {v[2]:.3f} ({ratio(v[2], v[0]):.2f}x)" if v[2] else f"{v[0]:.3f} / -")
            else:
                rf, rb = ratio(v[1], v[0]), ratio(v[3], v[2])
                cells.append(f"{v[0]:.3f} / {v[2]:.3f} ({rf:.2f}x / {rb:.2f}x)" if rf and rb else f"{v[0]:.3f} / {v[2]}")
        lines.append(f"| {sess} ({label}) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "delta_rule_history"))
    args = ap.parse_args()
    runs = collect(args.results)
    if not runs:
        raise SystemExit(f"no benchmark tables found under {args.results}")
    plot(runs, args.out + ".png")
    with open(args.out + ".md", "w", encoding="utf-8") as f:
        f.write("# Issue 6's benchmark rows by session (written by bench/delta_rule_history.py)\n\n")
        f.write("flashgrad forward / backward ms (fla / flashgrad speed ratios, same process), the last "
                "benchmark table of each session in bench/results; recurrent: forward / backward ms "
                "(backward / forward). Plot: delta_rule_history.png. From run 23.2 on, the backward excludes "
                "PyTorch's AccumulateGrad adds into the inputs' .grad (~0.28 ms at B8 T4096 for either "
                "library; the bench resets .grad before each timed call), which every earlier run timed as "
                "backward.\n\n")
        f.write(latest_table(runs))
    print(f"{len(runs)} runs -> {args.out}.png, {args.out}.md")


if __name__ == "__main__":
    main()
