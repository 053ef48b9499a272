#!/usr/bin/env python3
"""Summary of `ncu --page source --print-source sass --csv` for one FP8 wgmma forward launch (fp8w.sh).

usage: fp8w_ncu_source.py CSV

Prints the columns the CSV has, the warp-stall samples per opcode (where the warps wait: the
WARPGROUP.DEPBAR waits for wgmma, SYNCS mbarrier waits, MUFU, the FMNMX / SHFL max chain, ...), and
the 50 instructions with the most samples, with their neighbours' addresses, so the SASS of the
same instance compiled on the development machine can be matched. Column names differ between
Nsight Compute versions, so they are found by substring.
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
        print("\n".join(lines[:20]))
        return
    rows = list(csv.reader(lines[start:]))
    header, rows = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    print("columns:", " | ".join(header))
    col = {name: i for i, name in enumerate(header)}
    find = lambda *keys: next((i for n, i in col.items() if all(k.lower() in n.lower() for k in keys)), None)
    c_src = find("source")
    c_addr = find("address")
    c_all = find("sampling", "all") if find("sampling", "all") is not None else find("sampl")
    c_not = find("sampling", "not")
    c_exec = find("instructions executed")
    if c_src is None or c_all is None:
        print("no source / sampling column")
        return
    total = sum(number(r[c_all]) for r in rows)
    print(f"instructions {len(rows)}, samples {total:.0f}")
    per_op = collections.Counter()
    per_op_not = collections.Counter()
    for r in rows:
        op = re.sub(r"^@!?U?P\w+\s+", "", r[c_src].strip()).split(" ")[0]
        per_op[op] += number(r[c_all])
        if c_not is not None:
            per_op_not[op] += number(r[c_not])
    print("samples per opcode (all / not issued), share of all samples:")
    for op, n in per_op.most_common(30):
        print(f"  {op:44s} {n:9.0f} {per_op_not[op]:9.0f}  {100 * n / max(total, 1):5.1f} %")
    print("top instructions (address, samples all / not issued, executed, source):")
    order = sorted(range(len(rows)), key=lambda i: -number(rows[i][c_all]))
    for i in order[:50]:
        r = rows[i]
        print(f"  {r[c_addr] if c_addr is not None else i:>8} {number(r[c_all]):8.0f} "
              f"{number(r[c_not]) if c_not is not None else 0:8.0f} "
              f"{number(r[c_exec]) if c_exec is not None else 0:10.0f}  {r[c_src].strip()[:90]}")


if __name__ == "__main__":
    main()
