#!/usr/bin/env python3
"""Copies the attention kernel headers into OUT_DIR with every inline-PTX statement replaced by a
call to a host emulation (../emulation_common/mma_sync_ptx.h; same variable names as the asm
operands) and the namespace flashgrad::cuda_attn renamed flashgrad::cuda_attn_emulated, so g++ can
compile the kernels' own source. usage: rewrite_asm.py SRC_DIR OUT_DIR

The FP8 wgmma harnesses' prepare_headers.py import it for the same rewrite plus their kernels'
PTX-free headers (copy_renamed) and the Hopper primitive headers emptied (empty_primitive_headers)."""
import pathlib
import re
import sys

# PTX mnemonic (regex on the asm text) -> replacement statement.
RULES = [
    (r"m16n8k32\.row\.col\.f32\.e4m3", "emu_mma_e4m3(c, a, b0, b1);"),
    (r"m16n8k16\.row\.col\.f32\.bf16", "emu_mma_16816<__nv_bfloat16>(c, a, b0, b1);"),
    (r"m16n8k16\.row\.col\.f32\.f16", "emu_mma_16816<__half>(c, a, b0, b1);"),
    (r"ldmatrix\.sync\.aligned\.m8n8\.x4\.trans", "emu_ldmatrix_x4(r, addr, true);"),
    (r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared", "emu_ldmatrix_x4(r, addr, false);"),
    (r"ex2\.approx", "y = emu_exp2(x);"),
    (r"cp\.async\.cg\.shared\.global.*16", "emu_cp_async(dst, src, bytes, 16);"),
    (r"cp\.async\.ca\.shared\.global.*4", "emu_cp_async(dst, src, bytes, 4);"),
    (r"cp\.async\.commit_group", ";"),
    (r"cp\.async\.wait_group", ";"),
    # inside #if defined(__CUDACC__) (pack_e4m3x4): the harness defines its own pack_e4m3x4
    (r"cvt\.rn\.satfinite\.e4m3x2", ";"),
]


def rewrite(text: str, name: str) -> str:
    res, i = [], 0
    for m in re.finditer(r"\basm\b", text):
        if m.start() < i:
            continue
        j = m.end()
        while text[j] in " \t\n" or text.startswith("volatile", j):
            j += len("volatile") if text.startswith("volatile", j) else 1
        if text[j] != "(":
            continue
        depth, k, in_str = 0, j, False
        while True:
            ch = text[k]
            if in_str:
                if ch == "\\":
                    k += 1
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        end = text.index(";", k) + 1
        body = text[m.start():end]
        for pat, repl in RULES:
            if re.search(pat, body):
                res.append(text[i:m.start()] + repl)
                break
        else:
            sys.exit(f"{name}: no emulation for asm statement: {body}")
        i = end
    res.append(text[i:])
    return "".join(res)


# The headers the FP8 kernels include (others, e.g. the wgmma kernels, use PTX this file does not emulate).
HEADERS = ["tile_primitives.cuh", "sequence_and_mask.cuh", "attention_kernel_params.h",
           "attention_forward_kernel.cuh", "attention_backward_kernel.cuh"]
# Own namespace: a harness linked against a CUDA build of flashgrad must not share symbols
# (template instances of the kernels) with the real ones.
RENAME = ("flashgrad::cuda_attn", "flashgrad::cuda_attn_emulated")


def rewrite_mma_sync_headers(src: pathlib.Path, out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    # The FP8 wgmma kernels (fp8_wgmma_*) use TMA / wgmma PTX this file does not emulate either: skipped.
    fp8_files = [f for f in sorted(src.glob("fp8_*.cuh")) + sorted(src.glob("fp8_*.h")) if not f.name.startswith("fp8_wgmma")]
    for f in [src / h for h in HEADERS] + fp8_files:
        t = f.read_text()
        t = t.replace("__cvta_generic_to_shared(p)", "emu_shared_offset(p)")
        t = t.replace(*RENAME)
        (out / f.name).write_text(rewrite(t, f.name))


def copy_renamed(src: pathlib.Path, out: pathlib.Path, names: list, ptx_home: str) -> None:
    """Copies headers that must hold no inline PTX (ptx_home: where it belongs), namespace renamed."""
    for name in names:
        text = (src / name).read_text()
        if re.search(r"\basm\b", text):
            sys.exit(f"{name} has inline PTX: move it into {ptx_home} (emulated in ../emulation_common/)")
        (out / name).write_text(text.replace(*RENAME))


def empty_primitive_headers(out: pathlib.Path) -> None:
    """wgmma_primitives.cuh and fp8_wgmma_primitives.cuh as empty headers: ../emulation_common/
    (mbarriers.h, tma.h, wgmma.h) defines their functions."""
    for name in ["wgmma_primitives.cuh", "fp8_wgmma_primitives.cuh"]:
        (out / name).write_text("// Emulated: harness.cc defines these functions.\n#pragma once\n")


if __name__ == "__main__":
    rewrite_mma_sync_headers(*map(pathlib.Path, sys.argv[1:3]))
