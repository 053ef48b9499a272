#!/usr/bin/env python3
"""Where the warps of one stage-1 launch wait, by phase (kdaprep.sh, from
`ncu --page source --print-source sass --csv`).

usage: kdaprep_ncu_source.py CSV

The kernel's phases are separated by block barriers, and its code runs from the top down (loops
branch back inside a phase), so the instructions between the n-th and the (n+1)-th BAR.SYNC in
address order are one phase: the summary lists the warp-stall samples and executed instructions
per such segment (with its most-sampled opcodes), then per opcode, then the 25 most-sampled
instructions. Column names differ between Nsight Compute versions, so they are found by substring.
"""
import collections
import csv
import re
import sys


def number(text):
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    lines = open(sys.argv[1], errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if "Source" in l and ("Address" in l or "#" in l)), None)
    if start is None:
        print("no source table in", sys.argv[1])
        print("\n".join(lines[:10]))
        return
    rows = list(csv.reader(lines[start:]))
    header, rows = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    col = {name: i for i, name in enumerate(header)}
    find = lambda *keys: next((i for n, i in col.items() if all(k.lower() in n.lower() for k in keys)), None)
    c_src, c_addr = find("source"), find("address")
    c_all = find("sampling", "all") if find("sampling", "all") is not None else find("sampl")
    c_exec = find("instructions executed")
    if c_src is None or c_all is None:
        print("no source / sampling column; columns:", " | ".join(header))
        return
    if c_addr is not None:
        rows.sort(key=lambda r: int(r[c_addr], 16) if re.fullmatch(r"(0x)?[0-9a-fA-F]+", r[c_addr].strip()) else 0)
    opcode = lambda r: re.sub(r"^@!?U?P\w+\s+", "", r[c_src].strip()).split(" ")[0]
    total = sum(number(r[c_all]) for r in rows)
    executed = sum(number(r[c_exec]) for r in rows) if c_exec is not None else 0
    print(f"instructions {len(rows)}, stall samples {total:.0f}, warp instructions executed {executed:.0f}")
    print("per segment between block barriers (segment: instructions, share of samples, executed, top opcodes):")
    seg, segs = 0, collections.defaultdict(lambda: [0, 0.0, 0.0, collections.Counter()])
    for r in rows:
        s = segs[seg]
        s[0] += 1
        s[1] += number(r[c_all])
        s[2] += number(r[c_exec]) if c_exec is not None else 0
        s[3][opcode(r)] += number(r[c_all])
        if opcode(r).startswith("BAR.SYNC") or opcode(r) == "BAR":
            seg += 1
    for k in sorted(segs):
        n, smp, ex, ops = segs[k]
        top = ", ".join(f"{o} {100 * v / max(smp, 1):.0f}%" for o, v in ops.most_common(4))
        print(f"  seg {k:2d}: {n:5d} instr, {100 * smp / max(total, 1):5.1f} % samples, {ex:11.0f} executed  ({top})")
    per_op = collections.Counter()
    for r in rows:
        per_op[opcode(r)] += number(r[c_all])
    print("samples per opcode:")
    for op, n in per_op.most_common(15):
        print(f"  {op:36s} {n:9.0f}  {100 * n / max(total, 1):5.1f} %")
    print("top instructions (address, samples, executed, source):")
    for r in sorted(rows, key=lambda r: -number(r[c_all]))[:25]:
        print(f"  {r[c_addr] if c_addr is not None else '':>8} {number(r[c_all]):8.0f} "
              f"{number(r[c_exec]) if c_exec is not None else 0:10.0f}  {r[c_src].strip()[:80]}")


if __name__ == "__main__":
    main()
