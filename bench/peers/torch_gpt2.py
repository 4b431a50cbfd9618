#!/usr/bin/python3
"""PyTorch peer of `troupe bench model --shape gpt2 --device cuda`: the GPT-2 small shape (12
layers, d_model 768, 12 heads, context 1024, vocabulary 50304 = 50257 padded to a multiple of
128), GPT-2 style pre-LN blocks, tanh GELU, tied head (124M parameters), AdamW (fused), trained on random tokens
at the same batch. PyTorch at its best on a GPU: scaled_dot_product_attention (flash), fused
AdamW, bf16 autocast with --bf16 (TF32 off in f32, as troupe's f32 GEMMs), optionally
torch.compile (--compile). A peer for comparison only, never a dependency.

Prints one JSON line: tokens/s, and MFU with the same model-FLOP count troupe uses
(models/blocks.cpp: per sample 3 x (24 T C^2 + 4 T^2 C) a layer, 6 T C V the head, 2 T C the
embedding) over the peak given with --peak-tflops.

Usage: python3 bench/peers/torch_gpt2.py --device cuda --bf16 --batch 16 --steps 20
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, nh):
        super().__init__()
        self.nh = nh
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc_out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):  # (PyTorch 2; 1.13 here: a smoke test)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.nh)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, ctx, d, nh, nl):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.Sequential(*[Block(d, nh) for _ in range(nl)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln" in name:
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, 0.0, 0.02)
        self.head.weight = self.tok.weight  # tied, as GPT-2 (and troupe's gpt2 shape)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        logits = self.head(self.ln_f(self.blocks(self.tok(idx) + self.pos(pos))))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.reshape(-1))


def flops_per_sample(T, C, V, L):
    return L * 3.0 * (24.0 * T * C * C + 4.0 * T * T * C) + 6.0 * T * C * V + 2.0 * T * C


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (master weights f32)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="for MFU (0: not reported)")
    a = ap.parse_args()
    dev = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model = GPT(a.vocab, a.context, a.d_model, a.heads, a.layers).to(dev)
    # Fused AdamW on CUDA (PyTorch 2); this machine's 1.13 CPU build has no `fused`.
    extra = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, **extra)
    step_model = torch.compile(model) if a.compile else model
    g = torch.Generator(device=dev).manual_seed(1234)

    def next_batch():
        x = torch.randint(0, a.vocab, (a.batch, a.context + 1), generator=g, device=dev)
        return x[:, :-1], x[:, 1:]

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    first = last = 0.0
    t0 = time.perf_counter()
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            sync()
            t0 = time.perf_counter()
        x, y = next_batch()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.bf16):
            loss = step_model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step == 0 or step + 1 == a.warmup + a.steps:
            last = loss.item()
            first = first or last
    sync()
    secs = time.perf_counter() - t0
    sps = a.steps * a.batch / secs
    flops = flops_per_sample(a.context, a.d_model, a.vocab, a.layers) * sps
    out = {"bench": "model", "impl": "pytorch" + ("+compile" if a.compile else ""),
           "shape": f"{a.layers}x{a.d_model}x{a.heads} ctx {a.context} vocab {a.vocab}",
           "device": a.device, "dtype": "bf16" if a.bf16 else "f32", "batch": a.batch,
           "steps": a.steps, "tokens_per_s": round(sps * a.context, 1),
           "model_tflops_per_s": round(flops / 1e12, 4), "first_loss": round(first, 4),
           "last_loss": round(last, 4), "torch": torch.__version__}
    if a.peak_tflops > 0:
        out["mfu"] = round(flops / (a.peak_tflops * 1e12), 4)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
