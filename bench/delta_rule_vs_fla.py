"""flashgrad's gated delta rule beside fla's Triton kernels (fla-core wheel), same process, same inputs.

fla refuses its chunked backward on Hopper with Triton 3.4-3.7.0 (wrong results); this script lifts
that guard for TIMING ONLY (fla.ops.common.chunk_o.TRITON_ABOVE_3_4_0 = False), as anchors.md did.
Times are CUDA-event medians; backward = (forward + backward) - forward, with the inputs' .grad set to
None before every timed call (as a training step after zero_grad(), PyTorch's default set_to_none): until
session 23 the repeated calls added into .grad, and those six AccumulateGrad adds (~0.28 ms at B8 T4096,
bench/backward_timeline.py) were timed as backward too, for both libraries; that older measure is still
printed as "bwd accum." beside it. Peak extra memory is
torch.cuda.max_memory_allocated during forward+backward minus the memory held by inputs; "fwd peak"
is the same for a forward alone under torch.no_grad (inference / evaluation: nothing kept for a
backward).

usage: python bench/delta_rule_vs_fla.py [--out table.md] [--json results.json] [--no-fla] [--cases KDA,recurrent]
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

try:
    from triton.testing import do_bench
except ImportError:  # pragma: no cover
    do_bench = None

import flashgrad

CASES = [  # name, kind, algorithm, B, T, H, K(=V)
    ("chunk GDN", "gdn", "chunk", 8, 4096, 16, 128),
    ("chunk GDN", "gdn", "chunk", 1, 32768, 16, 128),
    ("chunk GDN K=V=64", "gdn", "chunk", 8, 4096, 16, 64),
    ("recurrent GDN", "gdn", "recurrent", 4, 4096, 16, 128),
    ("chunk KDA", "kda", "chunk", 4, 4096, 16, 128),  # last: fla's KDA autotuning alone takes minutes
]
ANCHOR_MS = {  # anchors.md (fla 0.5.2, same H200 kind): fwd, bwd
    ("chunk GDN", 8, 4096): (0.933, 2.409), ("chunk GDN", 1, 32768): (1.281, 3.502),
    ("chunk GDN K=V=64", 8, 4096): (1.036, 3.281), ("chunk KDA", 4, 4096): (0.939, 3.947),
    ("recurrent GDN", 4, 4096): (7.204, None),
}


def bench_ms(fn, grad_to_none=None):
    """Median ms of fn; grad_to_none: tensors whose .grad is reset to None before every call (untimed)."""
    if do_bench is not None:
        return do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none, return_mode="median")
    fn(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(10):
        for x in grad_to_none or []:
            x.grad = None
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    return sorted(ts)[len(ts) // 2]


def make_inputs(kind, B, T, H, K):
    torch.manual_seed(0)
    dt = torch.bfloat16
    q = torch.randn(B, T, H, K, device="cuda", dtype=dt)
    k = F.normalize(torch.randn(B, T, H, K, device="cuda", dtype=torch.float32), dim=-1).to(dt)
    v = torch.randn(B, T, H, K, device="cuda", dtype=dt)
    gshape = (B, T, H) if kind == "gdn" else (B, T, H, K)
    g = (F.logsigmoid(torch.randn(gshape, device="cuda", dtype=torch.float32)) / 4)
    beta = torch.rand(B, T, H, device="cuda", dtype=torch.float32).sigmoid().to(dt)
    h0 = torch.randn(B, H, K, K, device="cuda", dtype=torch.float32) * 0.1
    return [t.requires_grad_() for t in (q, k, v, g, beta, h0)]


def measure(fn, inputs):
    """fn(*inputs) -> (o, final_state). Returns fwd ms, bwd ms (or None), peak extra MiB of forward +
    backward (or None), peak extra MiB of a forward under no_grad, bwd ms with .grad accumulating (or None)."""
    with torch.no_grad():
        fn(*inputs)
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = fn(*inputs); torch.cuda.synchronize()
        fwd_peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        del out
    o, ht = fn(*inputs)
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    fwd = bench_ms(lambda: fn(*inputs))
    bwd, peak, bwd_acc = None, None, None
    try:
        def both():
            o, ht = fn(*inputs)
            torch.autograd.backward((o, ht), (do, dht))
        both()
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        both(); torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        bwd = max(bench_ms(both, grad_to_none=inputs) - fwd, 1e-9)
        both()  # .grad set again: the older measure, the repeated calls adding into it
        bwd_acc = max(bench_ms(both) - fwd, 1e-9)
    except NotImplementedError as e:
        print(f"  backward refused: {str(e)[:100]}")
    return fwd, bwd, peak, fwd_peak, bwd_acc


def flashgrad_fn(kind, algo):
    name = {("gdn", "chunk"): "chunk_gated_delta_rule", ("gdn", "recurrent"): "fused_recurrent_gated_delta_rule",
            ("kda", "chunk"): "chunk_kda", ("kda", "recurrent"): "fused_recurrent_kda"}[(kind, algo)]
    f = getattr(flashgrad, name)
    return lambda q, k, v, g, beta, h0: f(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True)


def fla_fn(kind, algo):
    import fla.ops.common.chunk_o as chunk_o
    chunk_o.TRITON_ABOVE_3_4_0 = False  # timing only: see the module docstring
    if kind == "gdn" and algo == "chunk":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as f
    elif kind == "gdn":
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as f
    else:
        from fla.ops.kda import chunk_kda as f
    return lambda q, k, v, g, beta, h0: f(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True)


def render(rows, dev):
    """The Markdown table of the rows measured so far (written after every row, so a run cut short
    by a time cap still leaves its table)."""
    def ms(v):
        return f"{v:.3f}" if isinstance(v, float) else "n/a"

    def ratio(a, b):
        return f"{a / b:.2f}x" if isinstance(a, float) and isinstance(b, float) else "n/a"

    out = [f"# Gated delta rule, bf16, ms — {dev}, {time.strftime('%Y-%m-%d')}, torch {torch.__version__}",
           "", "| case | B T H K | flashgrad fwd | fla fwd | fla/fg fwd | flashgrad bwd | fla bwd | fla/fg bwd | "
           "fg tokens/s (fwd+bwd) | fg peak MiB | fla peak MiB | fg fwd peak MiB | fla fwd peak MiB | "
           "anchor fla fwd/bwd | fg / fla bwd accum. |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tot = (r.get("fg_fwd") or 0) + (r.get("fg_bwd") or 0)
        tps = f"{r['B'] * r['T'] / (tot / 1e3):.3g}" if tot else "n/a"
        a = r["anchor"]
        out.append(f"| {r['case']} | {r['B']} {r['T']} {r['H']} {r['K']} | {ms(r.get('fg_fwd'))} | {ms(r.get('fla_fwd'))} | "
                   f"{ratio(r.get('fla_fwd'), r.get('fg_fwd'))} | {ms(r.get('fg_bwd'))} | {ms(r.get('fla_bwd'))} | "
                   f"{ratio(r.get('fla_bwd'), r.get('fg_bwd'))} | {tps} | {ms(r.get('fg_peak'))} | {ms(r.get('fla_peak'))} | "
                   f"{ms(r.get('fg_fwd_peak'))} | {ms(r.get('fla_fwd_peak'))} | {a if a else 'n/a'} | "
                   f"{ms(r.get('fg_bwd_acc'))} / {ms(r.get('fla_bwd_acc'))} |")
    errs = [f"- {r['case']} B{r['B']} T{r['T']}: {k} = {v}" for r in rows for k, v in r.items() if k.endswith("_err")]
    table = "\n".join(out + (["", "Errors:"] + errs if errs else []))
    return table


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out"); ap.add_argument("--json"); ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--cases", default="",
                    help="comma-separated substrings of 'NAME B<b> T<t>' (e.g. 'KDA,recurrent'): only the "
                         "matching rows (fla's autotuning makes all five ~5 min)")
    args = ap.parse_args()
    wanted = [w.strip() for w in args.cases.split(",") if w.strip()]
    dev = torch.cuda.get_device_name()
    rows = []
    table = ""
    for (name, kind, algo, B, T, H, K) in CASES:
        if wanted and not any(w in f"{name} B{B} T{T}" for w in wanted):
            continue
        inputs = make_inputs(kind, B, T, H, K)
        r = dict(case=name, B=B, T=T, H=H, K=K)
        for who, make in (("fg", lambda: flashgrad_fn(kind, algo)), ("fla", lambda: fla_fn(kind, algo))):
            if who == "fla" and args.no_fla:
                continue
            t_start = time.time()
            print(f"  {name} B{B} T{T}: {who} ...", file=sys.stderr, flush=True)
            try:
                fwd, bwd, peak, fwd_peak, bwd_acc = measure(make(), inputs)
                r.update({f"{who}_fwd": fwd, f"{who}_bwd": bwd, f"{who}_peak": peak, f"{who}_fwd_peak": fwd_peak,
                          f"{who}_bwd_acc": bwd_acc})
            except Exception as e:
                r[f"{who}_err"] = f"{type(e).__name__}: {str(e)[:100]}"
            torch.cuda.synchronize()
            print(f"  {name} B{B} T{T}: {who} done in {time.time() - t_start:.0f} s "
                  f"(fwd {r.get(who + '_fwd')}, bwd {r.get(who + '_bwd')})", file=sys.stderr, flush=True)
        r["anchor"] = ANCHOR_MS.get((name, B, T))
        rows.append(r)
        print(json.dumps(r), flush=True)
        del inputs
        torch.cuda.empty_cache()
        table = render(rows, dev)
        if args.out:
            open(args.out, "w").write(table + "\n")
        if args.json:
            json.dump(dict(device=dev, rows=rows), open(args.json, "w"), indent=1, default=str)
    print(table)


if __name__ == "__main__":
    sys.exit(main())
