#!/usr/bin/env python3
"""Static instruction count of the FP8 wgmma forward's consumer loop (the full-tile hot path).

usage: fp8w_hot_path.py OBJECT_OR_SASS [--d 128|256]

OBJECT_OR_SASS: an object holding one instance of fp8_attention_forward_wgmma_kernel (overlapped
schedule, no ping-pong, kLean: the session-4 stream has no fast next-block step to walk), e.g.
compiled from a .cu that instantiates only it, or its `cuobjdump -sass` text. The walk
(docs/perf/attention_fp8_wgmma.md, session 5):
  - the loop's issue of S and P V (the first QGMMA with its A operand in registers) and the wait
    for S (WARPGROUP.DEPBAR) end at the next branch, the softmax-mode dispatch; its target T is the
    short (full tile) softmax block, which runs on to the loop's back edge `BRA TOP`;
  - from TOP the first branch skips to the issue for an item inside the key block (hd 256 path A:
    sub-block 0 -> 1), the second one (hd 128's first) to the issue after the fast next-block
    step (path B: next key block through fp8w_full_run_end);
  - the mbarrier retry loops (IADD3, ISETP, BRA, BPT.TRAP before a TRAP) are not executed when the
    data is there and are skipped.
Prints the total per loop iteration (per warp) and the count per opcode.
"""
import argparse
import collections
import re
import shutil
import subprocess
import sys


def sass_lines(path):
    text = open(path, errors="replace").read() if path.endswith(".sass") else None
    if text is None:
        tool = shutil.which("cuobjdump") or next(
            (p for p in ["/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/triton/backends/nvidia/bin/cuobjdump"]
             if shutil.os.path.exists(p)), None)
        if tool is None:
            sys.exit("no cuobjdump on PATH")
        text = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;", line)
        if m:
            out.append((int(m.group(1), 16), m.group(2)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--d", type=int, default=128)
    a = ap.parse_args()
    ins = sass_lines(a.path)
    at = {addr: i for i, (addr, _) in enumerate(ins)}
    target = lambda i: at[int(re.search(r"BRA (?:P\d, )?0x([0-9a-f]+)", ins[i][1]).group(1), 16)]
    # The loop's P V issue (QGMMA with its A operand in registers) comes first in the code; before
    # the loop only S is issued.
    first_pv = next(i for i, (_, t) in enumerate(ins) if re.match(r"QGMMA\S* R\d+, R\d+, gdesc", t))
    depbar = next(i for i in range(first_pv, len(ins)) if ins[i][1].startswith("WARPGROUP.DEPBAR"))
    issue_end = next(i for i in range(depbar, len(ins)) if "BRA" in ins[i][1])
    soft = target(issue_end)
    back = next(i for i in range(soft, len(ins)) if re.fullmatch(r"BRA 0x[0-9a-f]+", ins[i][1]) and target(i) < issue_end)
    top = target(back)
    branches = [i for i in range(top, issue_end) if "BRA" in ins[i][1]]
    paths = {"A": branches[0], "B": branches[1]} if a.d == 256 else {"": branches[0]}
    for name, br in paths.items():
        start = target(br)
        idx = list(range(top, br + 1)) + list(range(start, issue_end + 1)) + list(range(soft, back + 1))
        skip = set()
        for i in range(start, issue_end + 1):
            if ins[i][1].startswith("BPT.TRAP"):
                skip.update(range(i - 3, i + 1))
        ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", ins[i][1]).split()[0].split(".")[0]
                                  for i in idx if i not in skip)
        label = f"path {name} " if name else ""
        print(f"{label}total {sum(ops.values())}: " + " ".join(f"{k} {v}" for k, v in ops.most_common()))


if __name__ == "__main__":
    main()
