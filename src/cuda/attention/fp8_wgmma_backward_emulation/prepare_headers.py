#!/usr/bin/env python3
"""Headers for the FP8 wgmma backward's host emulation (harness.cc), in OUT_DIR: the 16-bit and
mma.sync FP8 headers as fp8_emulation/rewrite_asm.py rewrites them, fp8_wgmma_backward_kernel.cuh
and the score / dQ staging / map headers it uses with the same namespace rename (they must hold no
inline PTX), and the two Hopper primitive headers emptied (../emulation_common/ defines their
functions). usage: prepare_headers.py SRC_DIR OUT_DIR"""
import pathlib
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "fp8_emulation"))
import rewrite_asm  # noqa: E402

src, out = map(pathlib.Path, sys.argv[1:3])
rewrite_asm.rewrite_mma_sync_headers(src, out)
rewrite_asm.copy_renamed(src, out, ["fp8_wgmma_backward_kernel.cuh", "wgmma_backward_scores.cuh", "fp8_wgmma_backward_maps.h",
                                    "fp8_wgmma_maps.h", "wgmma_dq_staging.cuh", "dq_accum_map.h"],
                         "a primitives header")
rewrite_asm.empty_primitive_headers(out)
