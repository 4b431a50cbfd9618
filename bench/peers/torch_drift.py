#!/usr/bin/python3
"""PyTorch side of `troupe bench drift`: the same experiment from the same start.

`troupe bench drift --dump DIR` writes the GPT's initial parameters (DIR/init.safetensors, with
the names of the twin in torch_models.py), every step's tokens (DIR/batches.safetensors) and
Troupe's two loss curves (DIR/troupe.json). This script loads them into the PyTorch twin and runs
  A: the whole global batch in one forward/backward,
  B: the batch in the same shares, each share's gradient computed alone, added last share first,
with the same optimizer, and prints how far A and B drift apart next to Troupe's numbers. It also
checks that the twin computes Troupe's function: the first loss from the same weights and tokens.

A peer for comparison only (Debian's python3-torch). Reads safetensors with a few lines of Python
(the `safetensors` package is not in Debian).

Usage: /usr/bin/python3 bench/peers/torch_drift.py DIR [--every 50]
"""
import argparse
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import GPT  # noqa: E402

DTYPES = {"F32": torch.float32, "I32": torch.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:end]), dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]) if e["shape"] else t
    return out


def build(cfg, init):
    model = GPT(cfg["vocab"], ctx=cfg["context"], d=cfg["d_model"], nh=cfg["heads"], nl=cfg["layers"])
    missing, unexpected = model.load_state_dict(init, strict=False)
    missing = [m for m in missing if not m.endswith(".mask")]
    if missing or unexpected:
        sys.exit(f"torch_drift: the dump does not fit the twin: missing {missing}, unexpected {unexpected}")
    if cfg["optimizer"] == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]),
                                eps=cfg["eps"], weight_decay=cfg["weight_decay"])
    else:
        opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"],
                              weight_decay=cfg["weight_decay"])
    return model, opt


def step_whole(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = model(x, y)
    loss.backward()
    opt.step()
    return loss.item()


def step_sharded(model, opt, x, y, shards):
    per = x.shape[0] // shards
    grads, total = [], 0.0
    for k in range(shards):
        opt.zero_grad(set_to_none=True)
        loss = model(x[k * per:(k + 1) * per], y[k * per:(k + 1) * per]) / shards
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        total += loss.item()
    for i, p in enumerate(model.parameters()):
        s = grads[-1][i].clone()
        for k in range(shards - 2, -1, -1):
            s += grads[k][i]
        p.grad = s
    opt.step()
    return total


def drift(a, b):
    diff = norm = 0.0
    worst, worst_rel = "", 0.0
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        dd = float(((p.detach().double() - q.detach().double()) ** 2).sum())
        nn = float((p.detach().double() ** 2).sum())
        diff, norm = diff + dd, norm + nn
        rel = (dd / nn) ** 0.5 if nn > 0 else dd ** 0.5
        if rel > worst_rel:
            worst, worst_rel = name, rel
    return (diff / norm) ** 0.5, worst, worst_rel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--every", type=int, default=50)
    a = ap.parse_args()
    torch.set_num_threads(1)
    with open(os.path.join(a.dir, "troupe.json")) as f:
        cfg = json.load(f)
    init = read_safetensors(os.path.join(a.dir, "init.safetensors"))
    batches = read_safetensors(os.path.join(a.dir, "batches.safetensors"))
    xs, ys = batches["inputs"].long(), batches["targets"].long()
    ma, oa = build(cfg, init)
    mb, ob = build(cfg, init)
    with torch.no_grad():
        first = ma(xs[0], ys[0]).item()
    print(f"same function: step 0 loss troupe {cfg['loss_a'][0]:.9f} pytorch {first:.9f} "
          f"(relative difference {abs(first - cfg['loss_a'][0]) / cfg['loss_a'][0]:.2e})")
    print(f"{'step':>6} {'troupe |A-B|':>13} {'pytorch |A-B|':>13} {'troupe params':>13} "
          f"{'pytorch params':>14}  most drifted in pytorch")
    rows = []
    for s in range(cfg["steps"]):
        la = step_whole(ma, oa, xs[s], ys[s])
        lb = step_sharded(mb, ob, xs[s], ys[s], cfg["shards"])
        if (s + 1) % a.every == 0 or s <= 10 or s + 1 == cfg["steps"]:
            rel, worst, worst_rel = drift(ma, mb)
            tdiff = abs(cfg["loss_a"][s] - cfg["loss_b"][s])
            trel = cfg["param_rel"][s]
            print(f"{s:6d} {tdiff:13.3g} {abs(la - lb):13.3g} {trel:13.3g} {rel:14.3g}  {worst} ({worst_rel:.3g})")
            rows.append({"step": s, "troupe_loss_diff": tdiff, "pytorch_loss_diff": abs(la - lb),
                         "troupe_param_rel_l2": trel, "pytorch_param_rel_l2": rel,
                         "pytorch_loss": la, "troupe_loss": cfg["loss_a"][s]})
    print(json.dumps({"bench": "drift", "impl": "pytorch", "optimizer": cfg["optimizer"], "lr": cfg["lr"],
                      "rows": rows}))


if __name__ == "__main__":
    main()
