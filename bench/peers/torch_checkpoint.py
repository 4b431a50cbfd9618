#!/usr/bin/python3
"""PyTorch peer of `troupe bench checkpoint`: torch.save and torch.load of the same state (an
MLP of 4096-wide layers with AdamW's two moments per parameter, as plain tensors: Debian's
python3-torch has no distributed checkpoint, so plain save/load is the peer). save is timed with
an fsync of the file (as Troupe's write is durable); load reads it back from the page cache, as
Troupe's restore does in its benchmark. One JSON line. A peer for comparison only.

Usage: /usr/bin/python3 bench/peers/torch_checkpoint.py --params 100e6 [--dir DIR]
"""
import argparse
import json
import math
import os
import tempfile
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=float, default=100e6)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    width = 4096
    blocks = max(1, math.ceil(a.params / (width * width + width)))
    state = {}
    for b in range(blocks):
        for name, shape in ((f"layers.{b}.weight", (width, width)), (f"layers.{b}.bias", (width,))):
            p = torch.randn(shape)
            state[name] = p
            state[name + ".exp_avg"] = p.clone()
            state[name + ".exp_avg_sq"] = p.clone()
    nbytes = sum(t.numel() * 4 for t in state.values())
    d = a.dir or tempfile.mkdtemp(prefix="troupe-torch-ckpt-")
    path = os.path.join(d, "state.pt")
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    save = time.perf_counter() - t0
    t0 = time.perf_counter()
    loaded = torch.load(path)
    load = time.perf_counter() - t0
    assert len(loaded) == len(state)
    os.remove(path)
    if not a.dir:
        os.rmdir(d)
    print(json.dumps({"bench": "checkpoint", "impl": "pytorch", "params": sum(t.numel() for k, t in state.items() if "exp_avg" not in k),
                      "bytes": nbytes, "save_s": round(save, 4), "load_s": round(load, 4), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
