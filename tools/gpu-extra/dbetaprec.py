"""dbetaprec (issue 6, session 19): how often the chunked GDN backward's dbeta passes its 0.02 bar in bf16
with a strong decay, and what the 16-bit dv_new costs it (docs/perf/delta_rule.md "Session 19": the host
emulation found dbeta 2.06e-2 at bf16 K = V = 128 H == HV = 1 T = 300, g = logsigmoid(x) / 0.1, with
every B2; 7.95e-3 with the intermediates in fp32).

For each case and seed: the GPU chunked path with its default 16-bit intermediates and with
FLASHGRAD_CHUNKED_STATE16=0 (all fp32; read per call), each against flashgrad's CPU reference on the
same bf16-rounded values in fp32; relative RMS of o, dq, dk, dv, dg, dbeta, dh0. Prints one line per
(case, seed, mode) and a summary of dbeta (worst, how many over 0.02).

usage: python tools/gpu-extra/dbetaprec.py [--seeds N]
"""
import argparse
import os

import torch
import torch.nn.functional as F

import flashgrad


def inputs(B, T, H, K, gdiv, seed, device):
    g0 = torch.Generator().manual_seed(seed)
    bf = torch.bfloat16
    q = torch.randn(B, T, H, K, generator=g0).to(bf)
    k = F.normalize(torch.randn(B, T, H, K, generator=g0), dim=-1).to(bf)
    v = torch.randn(B, T, H, K, generator=g0).to(bf)
    g = F.logsigmoid(torch.randn(B, T, H, generator=g0)) / gdiv
    beta = torch.rand(B, T, H, generator=g0).sigmoid().to(bf)
    h0 = torch.randn(B, H, K, K, generator=g0) * 0.1
    do = torch.randn(B, T, H, K, generator=g0).to(bf)
    dht = torch.randn(B, H, K, K, generator=g0)
    return [t.to(device) for t in (q, k, v, g, beta, h0)], [t.to(device) for t in (do, dht)]


def grads(xs, dys, dtype):
    xs = [x.to(dtype if x.dtype == torch.bfloat16 else x.dtype).detach().requires_grad_() for x in xs]
    q, k, v, g, beta, h0 = xs
    o, ht = flashgrad.chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0,
                                             output_final_state=True, use_qk_l2norm_in_kernel=True)
    do, dht = dys
    torch.autograd.backward((o, ht), (do.to(o.dtype), dht))
    return {"o": o, "dq": q.grad, "dk": k.grad, "dv": v.grad, "dg": g.grad, "dbeta": beta.grad, "dh0": h0.grad}


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=6)
    args = ap.parse_args()
    cases = [(1, 300, 1, 128, 0.1), (2, 512, 2, 128, 0.1), (1, 300, 1, 128, 1.0), (2, 512, 2, 64, 0.1)]
    worst, over, n = {}, {}, {}
    for (B, T, H, K, gdiv) in cases:
        for seed in range(args.seeds):
            xs, dys = inputs(B, T, H, K, gdiv, 1000 + seed, "cpu")
            ref = grads([x.float() if x.dtype == torch.bfloat16 else x for x in xs], dys, torch.float32)
            for mode in ("16-bit", "fp32"):
                if mode == "fp32":
                    os.environ["FLASHGRAD_CHUNKED_STATE16"] = "0"
                else:
                    os.environ.pop("FLASHGRAD_CHUNKED_STATE16", None)
                got = grads([x.cuda() for x in xs], [d.cuda() for d in dys], torch.bfloat16)
                torch.cuda.synchronize()
                errs = {name: rel(got[name], ref[name]) for name in ref}
                key = (B, T, H, K, gdiv, mode)
                worst[key] = max(worst.get(key, 0.0), errs["dbeta"])
                over[key] = over.get(key, 0) + (errs["dbeta"] > 0.02)
                n[key] = n.get(key, 0) + 1
                print(f"B{B} T{T} H{H} K=V={K} g/{gdiv} seed {seed} {mode:6s}: " +
                      " ".join(f"{k} {v:.2e}" for k, v in errs.items()), flush=True)
    os.environ.pop("FLASHGRAD_CHUNKED_STATE16", None)
    print("SUMMARY dbeta rel RMS against the CPU reference (bar 0.02):")
    for key in worst:
        B, T, H, K, gdiv, mode = key
        print(f"SUMMARY B{B} T{T} H{H} K=V={K} g/{gdiv} {mode}: worst {worst[key]:.2e}, over the bar {over[key]} / {n[key]}")


if __name__ == "__main__":
    main()
