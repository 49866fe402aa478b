"""A data-parallel worker for test_torchrun.py: each rank trains on its share of every batch.

    dp_worker.py OUT MODE [--save DIR] [--resume DIR] [--steps N]
MODE: offload, resident or zero2 (offload with dist.zero_stage=2)."""

import argparse
import json
import os

import tandem
from models import BATCH, batch, engine_config, loss_of, tiny_llama

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("mode", choices=["offload", "resident", "zero2"])
ap.add_argument("--save", default="")
ap.add_argument("--resume", default="")
ap.add_argument("--steps", type=int, default=6)
args = ap.parse_args()
rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
extra = {"dist.backend": "gloo"}
if args.mode == "zero2":
    extra["dist.zero_stage"] = 2
model = tiny_llama()
rows = BATCH // world
losses = []
with tandem.Engine(model, engine_config(args.mode != "resident", **extra)) as engine:
    if args.resume:
        engine.load(args.resume)
    for s in range(engine.global_step, args.steps):
        x, y = batch(s, slice(rank * rows, (rank + 1) * rows))
        loss = loss_of(model, x, y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        if args.save and engine.global_step == 3:
            engine.save(args.save)
    world_size = engine.world_size
with open(f"{args.out}.{rank}", "w") as f:
    json.dump({"losses": losses, "world": world_size}, f)
