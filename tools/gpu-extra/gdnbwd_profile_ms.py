"""Self CUDA time per step of every chunk_* kernel in a bench/profile_delta_rule.py log.

usage: gdnbwd_profile_ms.py LOG STEPS   (used by gdnbwd.sh; the table's columns are separated by
2+ spaces, the kernel names are truncated without double spaces)
"""
import re
import sys

lines = open(sys.argv[1]).read().splitlines()
steps = int(sys.argv[2])
head = next((l for l in lines if "Self CUDA" in l), None)
if head:
    col = re.split(r"\s{2,}", head.strip()).index("Self CUDA")
    for l in lines:
        if "chunk_" in l and "::" in l:
            f = re.split(r"\s{2,}", l.strip())
            name = re.sub(r"^void flashgrad::cuda_detail::delta_rule::", "", f[0]).split("<")[0]
            t = f[col]
            ms = float(t[:-2]) / (1000.0 if t.endswith("us") else 1.0)
            print(f"{name} {ms / steps:.3f} ms/step")
