#!/usr/bin/python3
"""PyTorch peer of `troupe bench model`: the same two models, same sizes and hyper-parameters,
CPU fp32, one process. A peer for comparison only (Debian's python3-torch), not a dependency.

  mlp: 784-1024-1024-10 (ReLU), synthetic Gaussian clusters, batch 256, SGD lr 0.01 -> samples/s
  gpt: 4 layers, d_model 128, 4 heads, context 64, GPT-2 style pre-LN, tanh GELU, untied head,
       GPL-3 text (char level), batch 32, AdamW lr 1e-3 wd 0.01 -> tokens/s

Prints one JSON line like troupe's: {"bench":"model","impl":"pytorch",...}. With --curve, the loss
every 20 steps on stderr. PyTorch uses the system BLAS: check that it is OpenBLAS (the field
"blas"); the reference BLAS is 20x slower and would make the comparison meaningless.

Usage: /usr/bin/python3 bench/peers/torch_models.py --model gpt --threads 1 --steps 50
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

TEXT = "/usr/share/common-licenses/GPL-3"


def blas_library():
    with open("/proc/self/maps") as f:
        for line in f:
            if "libblas.so" in line or "libopenblas" in line:
                return line.split()[-1]
    return ""


def blas_name():
    lib = blas_library()
    return "openblas" if "openblas" in lib else (lib or "unknown")


def blas_core():
    """The OpenBLAS kernels this process runs (as `troupe bench model` reports its own)."""
    import ctypes
    try:
        name = ctypes.CDLL(blas_library()).openblas_get_corename
        name.restype = ctypes.c_char_p
        return name().decode()
    except (OSError, AttributeError):
        return "unknown"


class Block(nn.Module):
    def __init__(self, d, nh, ctx):
        super().__init__()
        self.nh = nh
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc_out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("mask", torch.tril(torch.ones(ctx, ctx, dtype=torch.bool)))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.nh))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, ctx=64, d=128, nh=4, nl=4):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.Sequential(*[Block(d, nh, ctx) for _ in range(nl)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln" in name:
                nn.init.ones_(p)
            elif name.endswith("proj.weight") or name.endswith("fc_out.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * nl))
            else:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        logits = self.head(self.ln_f(self.blocks(x)))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt", choices=["mlp", "gpt"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--curve", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    if a.model == "mlp":
        batch, per_sample = 256, 1
        model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
        centroids = torch.randn(10, 784, generator=g) * 0.3
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def next_batch():
            y = torch.randint(0, 10, (batch,), generator=g)
            return centroids[y] + torch.randn(batch, 784, generator=g), y

        def loss_of(x, y):
            return F.cross_entropy(model(x), y)
    else:
        batch, ctx = 32, 64
        per_sample = ctx
        text = open(TEXT, "rb").read()
        vocab = sorted(set(text))
        index = {c: i for i, c in enumerate(vocab)}
        data = torch.tensor([index[c] for c in text], dtype=torch.long)
        model = GPT(len(vocab))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

        def next_batch():
            ix = torch.randint(0, len(data) - ctx - 1, (batch,), generator=g)
            return (torch.stack([data[i:i + ctx] for i in ix]), torch.stack([data[i + 1:i + 1 + ctx] for i in ix]))

        def loss_of(x, y):
            return model(x, y)

    params = sum(p.numel() for p in model.parameters())
    first = last = 0.0
    t0 = time.perf_counter()
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            t0 = time.perf_counter()
        x, y = next_batch()
        loss = loss_of(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        last = loss.item()
        if step == 0:
            first = last
        if a.curve and (step % 20 == 0 or step + 1 == a.warmup + a.steps):
            print(f"step {step} loss {last:.4f}", file=__import__("sys").stderr)
    secs = time.perf_counter() - t0
    sps = a.steps * batch / secs
    print(json.dumps({"bench": "model", "impl": "pytorch", "model": a.model, "threads": a.threads,
                      "batch": batch, "params": params, "steps": a.steps, "samples_per_s": round(sps, 1),
                      "tokens_per_s": round(sps * per_sample, 1), "first_loss": round(first, 4),
                      "last_loss": round(last, 4), "blas": blas_name(), "blas_core": blas_core(), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
