#!/usr/bin/env python3
"""PyTorch's DataLoader over a numpy.memmap of a Troupe token data set's shards: the peer of
`troupe bench data` (bench/compare_data.sh). Windows of context + 1 tokens at stride context,
shuffled (shuffle=True), batch_size windows a batch, inputs and targets as int64 tensors (what
nn.Embedding and cross_entropy take). Prints one JSON line like troupe's."""
import argparse
import json
import os
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Windows(Dataset):
    def __init__(self, shards, dtype, context):
        self.shards, self.dtype, self.T = shards, dtype, context
        self.maps = None
        sizes = [os.path.getsize(s) // np.dtype(dtype).itemsize for s in shards]
        self.tokens = sum(sizes)
        if len(shards) != 1:
            raise SystemExit("torch_loader.py reads one-shard data sets (prepare with a larger "
                             "--shard-tokens)")
        self.n = (self.tokens - 1) // context

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.maps is None:  # (opened in each loader process)
            self.maps = np.memmap(self.shards[0], dtype=self.dtype, mode="r")
        w = torch.from_numpy(self.maps[i * self.T:(i + 1) * self.T + 1].astype(np.int64))
        return w[:-1], w[1:]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--seconds", type=float, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    m = json.load(open(os.path.join(a.data, "manifest.json")))
    dtype = np.uint16 if m["token_bytes"] == 2 else np.uint32
    ds = Windows([os.path.join(a.data, s["file"]) for s in m["shards"]], dtype, a.context)
    loader = DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers,
                        drop_last=True, persistent_workers=a.workers > 0,
                        generator=torch.Generator().manual_seed(0))
    it = iter(loader)
    for _ in range(4):  # (loader processes started, first batches in flight)
        next(it)
    batches, checksum, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            continue
        checksum += int(y[-1, -1])
        batches += 1
    dt = time.perf_counter() - t0
    print(json.dumps({"bench": "data", "impl": "torch_dataloader", "loader_workers": a.workers,
                      "context": a.context, "batch": a.batch, "batches": batches,
                      "tokens_per_s": round(batches * a.batch * a.context / dt),
                      "batch_time_us": round(dt / batches * 1e6, 2), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
