#!/usr/bin/python3
"""PyTorch DDP peer of Troupe's data-parallel training: the MLP 784-1024-1024-10 with a global
batch of 512 split over --world processes (1 thread each, gloo), SGD. Prints one JSON line with
samples/s (wall clock over the timed steps). A peer for comparison only.

Usage: OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/peers/torch_ddp.py --world 2 --steps 30
"""
import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def run(rank, world, port, steps, warmup, batch, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    ddp = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(1234 + rank)
    centroids = torch.randn(10, 784, generator=torch.Generator().manual_seed(7)) * 0.3
    local = batch // world
    t0 = time.perf_counter()
    for step in range(warmup + steps):
        if step == warmup:
            dist.barrier()
            t0 = time.perf_counter()
        y = torch.randint(0, 10, (local,), generator=g)
        x = centroids[y] + torch.randn(local, 784, generator=g)
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    dist.barrier()
    secs = time.perf_counter() - t0
    if rank == 0:
        out.put({"bench": "dp", "impl": "pytorch_ddp", "workers": world, "global_batch": batch,
                 "samples_per_s": round(steps * batch / secs, 1)})
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=512)
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, a.world, port, a.steps, a.warmup, a.batch, q)) for r in range(a.world)]
    for p in procs:
        p.start()
    result = q.get(timeout=600)
    for p in procs:
        p.join()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
