#!/usr/bin/python3
"""Loads `troupe export` output into the PyTorch twin of Troupe's GPT (torch_models.GPT) and prints
its loss on a batch, as one JSON line: {"loss": ...}. The model's shape comes from the file's
metadata; the batch from `troupe export --batch-of-step S` (FILE.batch.safetensors). Troupe's loss
on the same batch with the same weights is step S's loss in the run's events.jsonl (the loss is
computed before that step's update, from the checkpoint of step S). A check for the export, not
a dependency; reads safetensors with a few lines of Python.

Usage: /usr/bin/python3 bench/peers/torch_check_export.py MODEL.safetensors BATCH.safetensors
"""
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import GPT  # noqa: E402
from torch_drift import read_safetensors  # noqa: E402


def metadata(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)).get("__metadata__", {})


def main():
    model_path, batch_path = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    meta = metadata(model_path)
    if meta.get("model.kind") != "gpt":
        sys.exit(f"torch_check_export: {model_path} is not a gpt export ({meta})")
    shape = {k: int(meta["model." + k]) for k in ("vocab", "context", "d_model", "heads", "layers")}
    model = GPT(shape["vocab"], ctx=shape["context"], d=shape["d_model"], nh=shape["heads"], nl=shape["layers"])
    missing, unexpected = model.load_state_dict(read_safetensors(model_path), strict=False)
    missing = [m for m in missing if not m.endswith(".mask")]
    if meta.get("model.tied_head") == "true":  # (the head is the token embedding: no head.weight)
        model.head.weight = model.tok.weight
        missing = [m for m in missing if m != "head.weight"]
    if missing or unexpected:
        sys.exit(f"torch_check_export: missing {missing}, unexpected {unexpected}")
    batch = read_safetensors(batch_path)
    x = batch["inputs"].long()
    y = batch["targets"].long().view(x.shape)
    with torch.no_grad():
        loss = model(x, y).double().item()
    print(json.dumps({"loss": loss, "params": sum(p.numel() for p in model.parameters())}))


if __name__ == "__main__":
    main()
