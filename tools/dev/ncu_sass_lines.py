"""Executed instructions and stall samples of one GPU kernel by CUDA source line, without -lineinfo on the GPU.

The GPU jobs' ncu source pages (tools/gpu-extra/lib/job_lib.sh, job_ncu with SOURCE=1: REPORT.csv.gz) list
every SASS instruction of the profiled kernel with its executed count and stall samples, but the GPU build
has no line table. The same kernel compiled here with the same nvcc and flags plus -lineinfo has the same
SASS (ptxas' .reuse flags aside; checked below, opcode by opcode), so its line table can be laid
over the GPU's counts. Session 22 used it on run 22.4's forward chain and B1 (docs/perf/delta_rule.md).

usage:
  # 1. one-kernel .cu with the instance, compiled from the profiled commit's sources:
  #    nvcc -std=c++20 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
  #         -Iinclude -Isrc -cubin -o k.cubin k.cu   (k.cu: #include the kernel's header;
  #         template __global__ void ns::kernel<...>(Args);)
  # 2. nvdisasm -g -c k.cubin > k.sass   (nvdisasm from the CUDA toolkit)
  python3 tools/dev/ncu_sass_lines.py REPORT.csv.gz k.sass [--top 30] [--segment N]
--segment N also ranks the lines inside segment N (the instructions after the N-th BAR.SYNC in address
order, before the next: the segments kdaprep_ncu_source.py reports).
"""
import argparse
import collections
import csv
import gzip
import re


def read_sass(path):
    """[(file:line or None, instruction text without .reuse)] in address order, from `nvdisasm -g`."""
    out, cur = [], None
    for line in open(path):
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)', line)
        if m:
            cur = f'{m.group(1).split("/")[-1]}:{m.group(2)}'
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if m:
            out.append((cur, re.sub(r"\s+", " ", m.group(1).replace(".reuse", "")).strip()))
    return out


def same_instruction(a, b):
    """The same opcode (with its modifiers and predicate): ncu prints neither .reuse flags nor branch
    targets as nvdisasm does, and orders some operands (LDGSTS) differently."""
    op = lambda t: re.sub(r"\s+", " ", t.replace(".reuse", "")).strip().split(" ")[:2 if t.strip().startswith("@") else 1]
    return op(a) == op(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv_gz")
    ap.add_argument("sass")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--segment", type=int, default=None)
    a = ap.parse_args()
    rows = list(csv.reader(gzip.open(a.csv_gz, "rt")))
    hdr, data = rows[1], rows[2:]
    i_src, i_ex = hdr.index("Source"), hdr.index("Instructions Executed")
    i_smp = hdr.index("Warp Stall Sampling (All Samples)")
    sass = read_sass(a.sass)
    if len(sass) != len(data):
        raise SystemExit(f"{len(sass)} local instructions against {len(data)} profiled: not the same kernel build")
    bad = [k for k, ((_, t), r) in enumerate(zip(sass, data)) if not same_instruction(t, r[i_src])]
    if bad:
        raise SystemExit(f"{len(bad)} instructions differ (first at {bad[0]}: '{sass[bad[0]][1]}' vs "
                         f"'{data[bad[0]][i_src].strip()}'): not the same SASS")
    ex, smp, seg_ex = collections.Counter(), collections.Counter(), collections.defaultdict(collections.Counter)
    seg = 0
    for (where, text), r in zip(sass, data):
        e, s = int(r[i_ex]), int(r[i_smp])
        ex[where] += e
        smp[where] += s
        if "BAR.SYNC" in text:
            seg += 1
        seg_ex[seg][where] += e
    te, ts = sum(ex.values()), max(sum(smp.values()), 1)
    print(f"executed warp instructions {te}, stall samples {ts}")
    print("  executed  samples  line")
    for where, v in ex.most_common(a.top):
        print(f"  {100 * v / te:6.1f}%  {100 * smp[where] / ts:6.1f}%  {where}")
    if a.segment is not None:
        st = max(sum(seg_ex[a.segment].values()), 1)
        print(f"segment {a.segment}: executed {st}")
        for where, v in seg_ex[a.segment].most_common(a.top):
            print(f"  {100 * v / st:6.1f}%  {v:>10}  {where}")


if __name__ == "__main__":
    main()
