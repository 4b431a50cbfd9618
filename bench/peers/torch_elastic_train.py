#!/usr/bin/python3
"""The torchrun peer of Troupe's elastic recovery benchmark: PyTorch DDP (gloo, CPU, 1 thread per
worker) on the MLP 784-1024-1024-10, SGD lr 0.1, a per-rank batch of --batch, a checkpoint every
--ckpt-every steps (rank 0, atomic rename). Started by torchrun; after a restart it resumes from
the checkpoint, so the steps since the last checkpoint are done again. A peer for comparison only.

Writes to $WORKDIR:  steps.log  "<unix time> <step> <rank> <world> <restart count>" per step,
                     pid.<rank> the worker's pid (for the benchmark's SIGKILL).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--ckpt-every", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(1)
    work = os.environ["WORKDIR"]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    with open(f"{work}/pid.{rank}", "w") as f:
        f.write(str(os.getpid()))
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start = 0
    ckpt = f"{work}/ckpt.pt"
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    ddp = nn.parallel.DistributedDataParallel(model)
    loss_fn = nn.CrossEntropyLoss()
    log = open(f"{work}/steps.log", "a", buffering=1)
    for step in range(start, a.steps):
        g = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(a.batch, 784, generator=g)
        y = torch.randint(0, 10, (a.batch,), generator=g)
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        opt.step()
        log.write(f"{time.time():.6f} {step} {rank} {world} {restart}\n")
        if rank == 0 and (step + 1) % a.ckpt_every == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1},
                       ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
