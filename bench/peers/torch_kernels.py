#!/usr/bin/env python3
"""The PyTorch peer of `troupe bench kernels` (bench/kernels_bench.cpp): the same operations at
the same shapes and the same timing (the median over 7 batches of 10 calls, 3 first untimed, each
batch ended by a synchronisation), on the CPU or on a CUDA device. f32 matmuls without TF32, as
Troupe's. The rows carry Troupe's names; bench/compare_kernels.sh and scripts/gpu-check.sh join
on them.

Usage: python3 bench/peers/torch_kernels.py [--device cpu|cuda] [--json] [--bf16]
       [--batch B] [--context T] [--d-model C] [--heads NH] [--vocab V] [--params P] [--threads N]
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F


def median_us(run, sync):
    for _ in range(3):
        run()
    sync()
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(10):
            run()
        sync()
        times.append((time.perf_counter() - t0) * 1e6 / 10)
    times.sort()
    return times[len(times) // 2]


def attention(q, k, v):
    """Causal attention: PyTorch's fused kernel where it has one (2.0 and later), else the math."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[-2]
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    return s.masked_fill(mask, float("-inf")).softmax(-1) @ v


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true")
    p.add_argument("--bf16", action="store_true", help="the bf16 rows only (linear, attention)")
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--context", type=int, default=0)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--params", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bandwidth-gbs", type=float, default=0)
    p.add_argument("--tflops", type=float, default=0)
    a = p.parse_args()
    gpu = a.device.startswith("cuda")
    if gpu and not torch.cuda.is_available():
        print("torch_kernels: no CUDA device", file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = a.device
    B = a.batch or (8 if gpu else 4)
    T = a.context or (1024 if gpu else 256)
    C, NH, V = a.d_model, a.heads, a.vocab
    P = a.params or (124_000_000 if gpu else 10_000_000)
    bandwidth = a.bandwidth_gbs or (4800 if gpu else 0)
    tflops = a.tflops or ((790 if a.bf16 else 67) if gpu else 0)
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    N = B * T
    rows = []

    def memory(name, nbytes, run):
        us = median_us(run, sync)
        limit = bandwidth * 1e9
        rows.append((name, us, nbytes, 0.0, nbytes / (us * 1e-6) / limit if limit else 0.0))

    def flops(name, fl, run):
        us = median_us(run, sync)
        limit = tflops * 1e12
        rows.append((name, us, 0.0, fl, fl / (us * 1e-6) / limit if limit else 0.0))

    randn = lambda *shape, **kw: torch.randn(*shape, device=dev, **kw)
    fc_flops = 2.0 * N * C * 4 * C
    hs = C // NH
    att_flops = 2.0 * B * NH * T * T * hs
    if a.bf16:
        xb, wb, b = randn(N, C).bfloat16(), (randn(4 * C, C) * 0.02).bfloat16(), randn(4 * C)
        # (bf16 inputs, f32 output as Troupe's: PyTorch's bf16 linear returns bf16.)
        flops("linear C -> 4C forward bf16", fc_flops, lambda: F.linear(xb, wb).float().add_(b))
        # Attention on bf16 tensors (flash attention where PyTorch has it; Troupe's reads f32 q, k,
        # v and rounds them as it stages them).
        qb, kb, vb = (randn(B, NH, T, hs).bfloat16().requires_grad_() for _ in range(3))
        flops("attention forward (causal) bf16", att_flops, lambda: attention(qb, kb, vb))
        ob = attention(qb, kb, vb)
        dob = torch.randn_like(ob)
        flops("attention backward (causal) bf16", 2.5 * att_flops,
              lambda: torch.autograd.grad(ob, [qb, kb, vb], dob, retain_graph=True))
        return report(a, rows)

    n4 = N * 4 * C
    x4, y4 = randn(N, 4 * C, requires_grad=True), randn(N, 4 * C)
    dy4 = randn(N, 4 * C)
    memory("copy (N x 4C)", 2.0 * n4 * 4, lambda: y4.copy_(x4.detach()))
    memory("gelu forward (N x 4C)", 2.0 * n4 * 4, lambda: F.gelu(x4, approximate="tanh"))
    g4 = F.gelu(x4, approximate="tanh")
    memory("gelu backward (N x 4C)", 4.0 * n4 * 4,
           lambda: torch.autograd.grad(g4, x4, dy4, retain_graph=True))

    n = N * C
    x, dy = randn(N, C, requires_grad=True), randn(N, C)
    ln = torch.nn.LayerNorm(C, device=dev)
    memory("layernorm forward (N x C)", 2.0 * n * 4, lambda: ln(x))
    out = ln(x)
    memory("layernorm backward (N x C)", 4.0 * n * 4,
           lambda: torch.autograd.grad(out, [x] + list(ln.parameters()), dy, retain_graph=True))

    q, k, v = (randn(B, NH, T, hs, requires_grad=True) for _ in range(3))
    flops("attention forward (causal)", att_flops, lambda: attention(q, k, v))
    o = attention(q, k, v)
    do = torch.randn_like(o)
    flops("attention backward (causal)", 2.5 * att_flops,
          lambda: torch.autograd.grad(o, [q, k, v], do, retain_graph=True))

    w = (randn(4 * C, C) * 0.02).requires_grad_()
    b = randn(4 * C, requires_grad=True)
    xs = randn(N, C, requires_grad=True)
    with torch.no_grad():
        flops("linear C -> 4C forward", fc_flops, lambda: F.linear(xs, w, b))
    y = F.linear(xs, w, b)
    dyl = torch.randn_like(y)
    flops("linear C -> 4C backward", 2 * fc_flops,
          lambda: torch.autograd.grad(y, [xs, w, b], dyl, retain_graph=True))

    logits = randn(N, V, requires_grad=True)
    targets = (torch.arange(N, device=dev) * 7919) % V

    def cross_entropy():
        loss = F.cross_entropy(logits, targets)
        torch.autograd.grad(loss, logits)
        return loss.item()  # (Troupe's returns the loss to the host too)

    memory("softmax cross-entropy (N x V)", 3.0 * N * V * 4, cross_entropy)

    name = "%dM" % (P // 1_000_000)
    prm = torch.nn.Parameter(randn(P))
    prm.grad = randn(P) * 1e-3
    memory("gradient norm (%s)" % name, 4.0 * P, lambda: torch.linalg.vector_norm(prm.grad).item())
    kw = {"fused": True} if gpu else {"foreach": True}
    opt = torch.optim.AdamW([prm], lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, **kw)
    memory("AdamW (%s, p g m v)" % name, 7.0 * 4 * P, opt.step)
    return report(a, rows)


def report(a, rows):
    if a.json:
        print(json.dumps([{"kernel": k, "us": round(us, 2), "bytes": nb, "flops": fl,
                           "of_limit": round(frac, 4)} for k, us, nb, fl, frac in rows]))
        return 0
    where = torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu"
    print(f"device: {where} (PyTorch {torch.__version__})")
    print("| kernel | us | GB/s or GFLOP/s | of the limit |\n|---|---|---|---|")
    for k, us, nb, fl, frac in rows:
        rate, unit = (nb / (us * 1e-6) / 1e9, "GB/s") if nb else (fl / (us * 1e-6) / 1e9, "GFLOP/s")
        limit = "%.0f%%" % (100 * frac) if frac else "-"
        print(f"| {k} | {us:.1f} | {rate:.1f} {unit} | {limit} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
