#!/usr/bin/python3
"""PyTorch gloo peer of `troupe bench allreduce`: torch.distributed.all_reduce (float sum) between
--world processes on loopback; same timing method as troupe's (iterations for about 0.3 s, 3
trials, median, averaged over ranks). Prints one JSON line per size from rank 0.

Usage: /usr/bin/python3 bench/peers/torch_allreduce.py --world 2 --sizes 4096,1048576
"""
import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world, port, sizes):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        buf = torch.zeros(count, dtype=torch.float32)
        dist.all_reduce(buf)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        est = time.perf_counter() - t0
        it = torch.tensor([min(10000.0, max(1.0, 0.3 / max(est, 1e-7)))], dtype=torch.float64)
        dist.broadcast(it, 0)
        iters = int(it.item())
        trials = []
        for _ in range(3):
            dist.barrier()
            s = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(buf)
            per = torch.tensor([(time.perf_counter() - s) / iters], dtype=torch.float64)
            dist.all_reduce(per)
            trials.append(per.item() / world)
        t = sorted(trials)[1]
        if rank == 0:
            busbw = 2.0 * (world - 1) / world * count * 4 / t / 1e9
            print(json.dumps({"bench": "allreduce", "impl": "pytorch_gloo", "workers": world, "bytes": count * 4,
                              "time_us": round(t * 1e6, 2), "busbw_gbps": round(busbw, 3), "iters": iters}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--sizes", default="4096,1048576,16777216,67108864")
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sizes = [int(x) for x in a.sizes.split(",")]
    mp.spawn(run, args=(a.world, port, sizes), nprocs=a.world, join=True)


if __name__ == "__main__":
    main()
