"""flashgrad FP8 (e4m3) attention beside flashgrad bf16 and cuDNN's FP8 SDPA (head dim 128).

Rows: B2 H16 S8192, head dims 128 and 256, causal and not. Per row, CUDA-event medians
(triton.testing.do_bench when available) of
  - flashgrad fp8 kernels: torch.ops.flashgrad.attention_forward / attention_backward on e4m3
    q, k, v already quantized (descales [B, H]), bf16 out and gradients (docs/fp8.md);
  - flashgrad fp8 end to end: flash_attn_fp8_func forward, and forward + backward minus forward,
    i.e. with the per-call quantization of q, k, v in torch;
  - flashgrad bf16 kernels: the same ops on bf16 q, k, v;
  - cuDNN FP8 SDPA (nvidia-cudnn-frontend graph API: sdpa_fp8 / sdpa_fp8_backward, per-tensor
    scales, fp8 O, dO, dQ, dK, dV: cuDNN's own recipe, lighter on memory than flashgrad's bf16
    out and gradients) for head dim 128 (--cudnn-all tries every row).
FLOPs (docs/attention.md): forward 4*B*H*S^2*D, halved when causal; backward 2.5 x forward.
Targets (issue 7): fp8 forward >= 1000 TFLOP/s at S8192 non-causal (hd128, hd256); fp8 backward
>= 1.3 x flashgrad bf16 backward, and >= cuDNN fp8 backward at hd128.
A backend that refuses a row is reported on that row (the error), never fatal.

usage: python bench/attention_fp8_bench.py [--out table.md] [--json results.json] [--quick] [--cudnn-all]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

try:
    from triton.testing import do_bench
except ImportError:  # pragma: no cover
    do_bench = None

import flashgrad
from flashgrad._torch_library import ops as flashgrad_ops  # loads the operator library
from flashgrad.fp8 import quantize_per_head

ROWS = [(2, 16, 8192, 128), (2, 16, 8192, 256)]  # B, H, S, D
FP8_FWD_TARGET = 1000.0      # TFLOP/s
BWD_VS_BF16_TARGET = 1.3


def bench_ms(fn):
    if do_bench is not None:
        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    torch.cuda.synchronize()
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _short(error: Exception) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())[:160]}"


# ---- flashgrad ----------------------------------------------------------------------------------


def flashgrad_kernel_times(q, k, v, causal, descales=None):
    """(forward ms, backward ms) of the low-level ops; descales given for e4m3 inputs."""
    ops = flashgrad_ops
    mask = "causal" if causal else "none"
    extra = {} if descales is None else dict(zip(("descale_q", "descale_k", "descale_v"), descales))
    fwd_args = (q, k, v, None, None, 0, 0, None, mask, -1, -1, None, None, 0.0, "tanh", 0.0, False)
    out, lse = ops.attention_forward(*fwd_args, **extra)
    dout = torch.randn_like(out)
    fwd = bench_ms(lambda: ops.attention_forward(*fwd_args, **extra))
    bwd_args = (dout, None, q, k, v, out, lse, None, None, 0, 0, None, mask, -1, -1, None, None, 0.0,
                "tanh", 0.0, False)
    bwd = bench_ms(lambda: ops.attention_backward(*bwd_args, **extra))
    return fwd, bwd


def flashgrad_fp8_end_to_end_times(q, k, v, causal):
    """flash_attn_fp8_func (quantization included): forward, and (forward + backward) - forward."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = flashgrad.flash_attn_fp8_func(q, k, v, causal=causal)
    dout = torch.randn_like(out)
    fwd = bench_ms(lambda: flashgrad.flash_attn_fp8_func(q, k, v, causal=causal))
    both = bench_ms(lambda: torch.autograd.grad(flashgrad.flash_attn_fp8_func(q, k, v, causal=causal),
                                                (q, k, v), dout))
    return fwd, max(both - fwd, 1e-9)


# ---- cuDNN FP8 SDPA (nvidia-cudnn-frontend) --------------------------------------------------------


class CudnnFp8:
    """cuDNN's FP8 SDPA forward and backward graphs on [B, S, H, D] e4m3 buffers (declared as
    (B, H, S, D) with BSHD strides), per-tensor scales all 1 except P's (448 / 1/448)."""

    def __init__(self, q8, k8, v8, causal):
        import cudnn
        self.cudnn = cudnn
        self.handle = cudnn.create_handle()
        cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream().cuda_stream)
        b, s, h, d = q8.shape
        self.dims = (b, h, s, d)
        self.strides = (s * h * d, d, h * d, 1)
        dev = q8.device
        self.q8, self.k8, self.v8 = q8, k8, v8
        self.o8 = torch.empty_like(q8)
        self.do8 = torch.randn(q8.shape, device=dev).to(torch.float8_e4m3fn)
        self.stats = torch.empty(b, h, s, 1, device=dev, dtype=torch.float32)
        self.grads = [torch.empty_like(x) for x in (q8, k8, v8)]
        one = lambda value=1.0: torch.full((1, 1, 1, 1), value, device=dev, dtype=torch.float32)  # noqa: E731
        self.scalars = {name: one() for name in ("dq", "dk", "dv", "do", "o", "dp", "scale_o", "scale_dq",
                                                 "scale_dk", "scale_dv", "scale_dp")}
        self.scalars["s"] = one(1.0 / 448)
        self.scalars["scale_s"] = one(448.0)
        self.amax = [one(0.0) for _ in range(6)]
        self.scale = d ** -0.5
        self.causal = causal
        self.forward_graph, self.forward_pack = self._build_forward()
        self.backward_graph, self.backward_pack = self._build_backward()
        self.forward_ws = torch.empty(self.forward_graph.get_workspace_size(), device=dev, dtype=torch.uint8)
        self.backward_ws = torch.empty(self.backward_graph.get_workspace_size(), device=dev, dtype=torch.uint8)

    def _graph(self):
        cudnn = self.cudnn
        return cudnn.pygraph(io_data_type=cudnn.data_type.FP8_E4M3,
                             intermediate_data_type=cudnn.data_type.FLOAT,
                             compute_data_type=cudnn.data_type.FLOAT, handle=self.handle)

    def _fp8(self, g, name):
        return g.tensor(name=name, dim=self.dims, stride=self.strides, data_type=self.cudnn.data_type.FP8_E4M3)

    def _scalar(self, g, name):
        return g.tensor(name=name, dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=self.cudnn.data_type.FLOAT)

    def _finish(self, g):
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([self.cudnn.heur_mode.A, self.cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()

    def _output(self, t, dims, strides, dtype):
        t.set_output(True).set_dim(dims).set_stride(strides).set_data_type(dtype)

    def _build_forward(self):
        cudnn, g = self.cudnn, self._graph()
        q, k, v = (self._fp8(g, n) for n in ("q", "k", "v"))
        sc = {n: self._scalar(g, n) for n in ("dq", "dk", "dv", "s", "scale_s", "scale_o")}
        o, stats, amax_s, amax_o = g.sdpa_fp8(
            q=q, k=k, v=v, descale_q=sc["dq"], descale_k=sc["dk"], descale_v=sc["dv"],
            descale_s=sc["s"], scale_s=sc["scale_s"], scale_o=sc["scale_o"], generate_stats=True,
            attn_scale=self.scale, use_causal_mask=self.causal, name="fp8_forward")
        self._output(o, self.dims, self.strides, cudnn.data_type.FP8_E4M3)
        b, h, s, _ = self.dims
        self._output(stats, (b, h, s, 1), (h * s, s, 1, 1), cudnn.data_type.FLOAT)
        for a in (amax_s, amax_o):
            self._output(a, (1, 1, 1, 1), (1, 1, 1, 1), cudnn.data_type.FLOAT)
        self._finish(g)
        pack = {q: self.q8, k: self.k8, v: self.v8, o: self.o8, stats: self.stats,
                amax_s: self.amax[0], amax_o: self.amax[1]}
        pack.update({t: self.scalars[n] for n, t in sc.items()})
        return g, pack

    def _build_backward(self):
        cudnn, g = self.cudnn, self._graph()
        q, k, v, o, do = (self._fp8(g, n) for n in ("q", "k", "v", "o", "do"))
        b, h, s, _ = self.dims
        stats = g.tensor(name="stats", dim=(b, h, s, 1), stride=(h * s, s, 1, 1), data_type=cudnn.data_type.FLOAT)
        names = ("dq", "dk", "dv", "o", "do", "s", "dp", "scale_s", "scale_dq", "scale_dk", "scale_dv", "scale_dp")
        sc = {n: self._scalar(g, "sc_" + n) for n in names}
        dq, dk, dv, *amax = g.sdpa_fp8_backward(
            q=q, k=k, v=v, o=o, dO=do, stats=stats, descale_q=sc["dq"], descale_k=sc["dk"],
            descale_v=sc["dv"], descale_o=sc["o"], descale_dO=sc["do"], descale_s=sc["s"],
            descale_dP=sc["dp"], scale_s=sc["scale_s"], scale_dQ=sc["scale_dq"], scale_dK=sc["scale_dk"],
            scale_dV=sc["scale_dv"], scale_dP=sc["scale_dp"], attn_scale=self.scale,
            use_causal_mask=self.causal, name="fp8_backward")
        for t in (dq, dk, dv):
            self._output(t, self.dims, self.strides, cudnn.data_type.FP8_E4M3)
        for a in amax:
            self._output(a, (1, 1, 1, 1), (1, 1, 1, 1), cudnn.data_type.FLOAT)
        self._finish(g)
        pack = {q: self.q8, k: self.k8, v: self.v8, o: self.o8, do: self.do8, stats: self.stats,
                dq: self.grads[0], dk: self.grads[1], dv: self.grads[2]}
        pack.update({a: self.amax[2 + i] for i, a in enumerate(amax)})
        pack.update({t: self.scalars[n] for n, t in sc.items()})
        return g, pack

    def forward(self):
        self.forward_graph.execute(self.forward_pack, self.forward_ws, handle=self.handle)

    def backward(self):
        self.backward_graph.execute(self.backward_pack, self.backward_ws, handle=self.handle)


def cudnn_times(q8, k8, v8, causal):
    runner = CudnnFp8(q8, k8, v8, causal)
    runner.forward()   # the backward reads its O and stats
    torch.cuda.synchronize()
    return bench_ms(runner.forward), bench_ms(runner.backward)


# ---- driver ---------------------------------------------------------------------------------------


def run_row(b, h, s, d, causal, with_cudnn):
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
    tflops = lambda ms, factor=1.0: factor * flops / ms / 1e9  # noqa: E731
    r = dict(row=f"B{b} H{h} S{s} D{d}", causal=causal)
    quantized = [quantize_per_head(t, h) for t in (q, k, v)]
    (q8, dsq), (k8, dsk), (v8, dsv) = quantized
    try:
        fwd, bwd = flashgrad_kernel_times(q8, k8, v8, causal, (dsq, dsk, dsv))
        r.update(fp8_fwd=tflops(fwd), fp8_bwd=tflops(bwd, 2.5), fp8_fwd_ms=fwd, fp8_bwd_ms=bwd)
        fwd, bwd = flashgrad_fp8_end_to_end_times(q, k, v, causal)
        r.update(fp8_e2e_fwd=tflops(fwd), fp8_e2e_bwd=tflops(bwd, 2.5))
    except Exception as error:  # e.g. NotImplementedError: no FP8 kernels in this build
        r["fp8_err"] = _short(error)
    try:
        fwd, bwd = flashgrad_kernel_times(q, k, v, causal)
        r.update(bf16_fwd=tflops(fwd), bf16_bwd=tflops(bwd, 2.5))
    except Exception as error:
        r["bf16_err"] = _short(error)
    if with_cudnn:
        try:
            fwd, bwd = cudnn_times(q8, k8, v8, causal)
            r.update(cudnn_fwd=tflops(fwd), cudnn_bwd=tflops(bwd, 2.5))
        except Exception as error:
            r["cudnn_err"] = _short(error)
    return r


def table(results, device):
    def f(r, key):
        return f"{r[key]:.0f}" if key in r else "n/a"

    def ratio(r, a, b):
        return f"{r[a] / r[b]:.2f}" if a in r and b in r else "n/a"

    cudnn_version = "?"
    try:
        import cudnn
        cudnn_version = f"frontend {getattr(cudnn, '__version__', '?')}, backend {cudnn.backend_version()}"
    except Exception:
        pass
    lines = [f"# FP8 attention, TFLOP/s — {device}, {time.strftime('%Y-%m-%d')}, torch {torch.__version__}, cuDNN {cudnn_version}",
             "",
             "flashgrad rows time the kernels (e4m3 inputs already quantized); 'e2e' is flash_attn_fp8_func "
             "with its torch quantization of q, k, v. cuDNN: sdpa_fp8 / sdpa_fp8_backward, fp8 in and out.",
             "",
             "| row | causal | fp8 fwd | bf16 fwd | fp8/bf16 fwd | cuDNN fp8 fwd | fp8/cuDNN fwd | fp8 bwd | bf16 bwd | fp8/bf16 bwd | cuDNN fp8 bwd | fp8/cuDNN bwd | e2e fwd | e2e bwd |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['row']} | {'yes' if r['causal'] else 'no'} | {f(r, 'fp8_fwd')} | {f(r, 'bf16_fwd')} | "
                     f"{ratio(r, 'fp8_fwd', 'bf16_fwd')} | {f(r, 'cudnn_fwd')} | {ratio(r, 'fp8_fwd', 'cudnn_fwd')} | "
                     f"{f(r, 'fp8_bwd')} | {f(r, 'bf16_bwd')} | {ratio(r, 'fp8_bwd', 'bf16_bwd')} | "
                     f"{f(r, 'cudnn_bwd')} | {ratio(r, 'fp8_bwd', 'cudnn_bwd')} | {f(r, 'fp8_e2e_fwd')} | "
                     f"{f(r, 'fp8_e2e_bwd')} |")
    targets = []
    for r in results:
        if "fp8_fwd" in r and not r["causal"]:
            targets.append(f"- {r['row']} non-causal fp8 forward {r['fp8_fwd']:.0f} TFLOP/s >= {FP8_FWD_TARGET:.0f}: "
                           f"{'met' if r['fp8_fwd'] >= FP8_FWD_TARGET else 'NOT met'}")
        if "fp8_bwd" in r and "bf16_bwd" in r:
            x = r["fp8_bwd"] / r["bf16_bwd"]
            targets.append(f"- {r['row']} causal={r['causal']} fp8 backward / bf16 backward {x:.2f} >= "
                           f"{BWD_VS_BF16_TARGET}: {'met' if x >= BWD_VS_BF16_TARGET else 'NOT met'}")
        if "fp8_bwd" in r and "cudnn_bwd" in r:
            x = r["fp8_bwd"] / r["cudnn_bwd"]
            targets.append(f"- {r['row']} causal={r['causal']} fp8 backward / cuDNN fp8 backward {x:.2f} >= 1: "
                           f"{'met' if x >= 1 else 'NOT met'}")
    errors = [f"- {r['row']} causal={r['causal']}: {k[:-4]}: {v}" for r in results for k, v in r.items()
              if k.endswith("_err")]
    out = lines
    if targets:
        out += ["", "Targets:"] + targets
    if errors:
        out += ["", "Refused or failed:"] + errors
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="write the markdown table here")
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="the hd128 rows only")
    ap.add_argument("--cudnn-all", action="store_true", help="try cuDNN on every head dim (default 128)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("attention_fp8_bench: no CUDA device", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name()
    results = []
    for b, h, s, d in ROWS[:1] if args.quick else ROWS:
        for causal in (False, True):
            r = run_row(b, h, s, d, causal, with_cudnn=args.cudnn_all or d == 128)
            results.append(r)
            print(json.dumps(r), flush=True)
            torch.cuda.empty_cache()
    text = table(results, device)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=device, results=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
