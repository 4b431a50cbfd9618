#!/usr/bin/env python3
"""The PyTorch peer of troupe_cuda_kernels_bench: the same operations at the same shapes (GPT-2
small: B x T = 8 x 1024 rows, C 768, 12 heads, vocabulary 50,304), timed with CUDA events (median
of 20 after 3 warm-ups), f32 matmuls without TF32 as Troupe's. Prints the same table.

Usage: python3 bench/peers/torch_kernels.py [--json]
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F


def median_us(run):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        run()
    times = []
    for _ in range(20):
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--bandwidth-gbs", type=float, default=4800)
    parser.add_argument("--tflops-f32", type=float, default=67)
    parser.add_argument("--tflops-bf16", type=float, default=790)
    a = parser.parse_args()
    if not torch.cuda.is_available():
        print("torch_kernels: no CUDA device", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda"
    B, T, C, NH, V = 8, 1024, 768, 12, 50304
    N = B * T
    rows = []

    def memory(name, nbytes, run):
        us = median_us(run)
        rows.append((name, us, nbytes, 0.0, nbytes / (us * 1e-6) / (a.bandwidth_gbs * 1e9)))

    def compute(name, flops, peak, run):
        us = median_us(run)
        rows.append((name, us, 0.0, flops, flops / (us * 1e-6) / (peak * 1e12)))

    x4 = torch.randn(N, 4 * C, device=dev, requires_grad=True)
    dy4 = torch.randn(N, 4 * C, device=dev)
    n4 = N * 4 * C
    memory("gelu forward (N x 4C)", 2.0 * n4 * 4, lambda: F.gelu(x4, approximate="tanh"))
    g4 = F.gelu(x4, approximate="tanh")
    memory("gelu backward (N x 4C)", 4.0 * n4 * 4,
           lambda: torch.autograd.grad(g4, x4, dy4, retain_graph=True))

    x = torch.randn(N, C, device=dev, requires_grad=True)
    r = torch.randn(N, C, device=dev)
    dy = torch.randn(N, C, device=dev)
    ln = torch.nn.LayerNorm(C, device=dev)
    n = N * C
    memory("layernorm + residual forward", 4.0 * n * 4, lambda: ln(x + r))
    out = ln(x + r)
    memory("layernorm backward", 4.0 * n * 4,
           lambda: torch.autograd.grad(out, [x] + list(ln.parameters()), dy, retain_graph=True))

    hs = C // NH
    att_flops = 2.0 * B * NH * T * T * hs
    q, k, v = (torch.randn(B, NH, T, hs, device=dev, requires_grad=True) for _ in range(3))
    compute("attention forward (fused)", att_flops, a.tflops_f32,
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    do = torch.randn_like(o)
    compute("attention backward (fused)", 2.5 * att_flops, a.tflops_f32,
            lambda: torch.autograd.grad(o, [q, k, v], do, retain_graph=True))

    w = torch.randn(4 * C, C, device=dev) * 0.02
    b = torch.randn(4 * C, device=dev)
    xs = torch.randn(N, C, device=dev)
    fc_flops = 2.0 * N * C * 4 * C
    compute("linear C -> 4C f32 (cuBLASLt)", fc_flops, a.tflops_f32, lambda: F.linear(xs, w, b))
    xb, wb = xs.bfloat16(), w.bfloat16()
    # (bf16 inputs, f32 output as Troupe's: PyTorch's bf16 linear returns bf16.)
    compute("linear C -> 4C bf16 (cuBLASLt)", fc_flops, a.tflops_bf16,
            lambda: F.linear(xb, wb).float().add_(b))

    logits = torch.randn(N, V, device=dev, requires_grad=True)
    targets = torch.zeros(N, dtype=torch.long, device=dev)
    memory("softmax cross-entropy (N x V, in place)", 3.0 * N * V * 4,
           lambda: torch.autograd.grad(F.cross_entropy(logits, targets), logits))

    params = 124_000_000
    p = torch.nn.Parameter(torch.randn(params, device=dev))
    p.grad = torch.randn(params, device=dev) * 1e-3
    memory("gradient norm (124M)", 4.0 * params, lambda: torch.linalg.vector_norm(p.grad))
    opt = torch.optim.AdamW([p], lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    memory("AdamW (124M, p g m v)", 7.0 * 4 * params, opt.step)

    if a.json:
        print(json.dumps([{"kernel": k, "us": round(us, 2), "bytes": nb, "flops": fl,
                           "of_limit": round(frac, 4)} for k, us, nb, fl, frac in rows]))
        return 0
    print(f"device: {torch.cuda.get_device_name()} (PyTorch {torch.__version__})")
    print("| kernel | us | GB/s or TFLOP/s | of the limit |\n|---|---|---|---|")
    for k, us, nb, fl, frac in rows:
        rate, unit = (nb / (us * 1e-6) / 1e9, "GB/s") if nb else (fl / (us * 1e-6) / 1e12, "TFLOP/s")
        print(f"| {k} | {us:.1f} | {rate:.1f} {unit} | {100 * frac:.0f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
