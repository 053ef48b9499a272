#!/usr/bin/env python3
"""Headers for the FP8 wgmma backward's host emulation (harness.cc), in OUT_DIR:
  - the 16-bit and mma.sync FP8 headers as the mma.sync FP8 emulation prepares them
    (fp8_emulation/rewrite_asm.py: inline PTX replaced by emulations, namespace renamed to
    flashgrad::cuda_attn_emulated);
  - fp8_wgmma_backward_kernel.cuh, wgmma_backward_scores.cuh, fp8_wgmma_backward_maps.h, fp8_wgmma_maps.h,
    wgmma_dq_staging.cuh, dq_accum_map.h with the same rename
    (they must hold no inline PTX: that lives in the two primitive headers);
  - wgmma_primitives.cuh and fp8_wgmma_primitives.cuh replaced by empty headers (harness.cc defines
    their functions).
usage: prepare_headers.py SRC_DIR OUT_DIR"""
import pathlib
import re
import subprocess
import sys

src, out = map(pathlib.Path, sys.argv[1:3])
here = pathlib.Path(__file__).resolve().parent
subprocess.run([sys.executable, str(here.parent / "fp8_emulation" / "rewrite_asm.py"), str(src), str(out)], check=True)
for name in ["fp8_wgmma_backward_kernel.cuh", "wgmma_backward_scores.cuh", "fp8_wgmma_backward_maps.h", "fp8_wgmma_maps.h",
             "wgmma_dq_staging.cuh", "dq_accum_map.h"]:
    text = (src / name).read_text()
    if re.search(r"\basm\b", text):
        sys.exit(f"{name} has inline PTX: move it into a primitives header (emulated in harness.cc)")
    (out / name).write_text(text.replace("flashgrad::cuda_attn", "flashgrad::cuda_attn_emulated"))
for name in ["wgmma_primitives.cuh", "fp8_wgmma_primitives.cuh"]:
    (out / name).write_text("// Emulated: harness.cc defines these functions.\n#pragma once\n")
