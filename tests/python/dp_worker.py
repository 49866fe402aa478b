"""A data-parallel worker for test_torchrun.py: each rank trains on its half of every batch."""

import json
import os
import sys

import tandem
from models import BATCH, batch, engine_config, loss_of, tiny_llama

rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
offload = sys.argv[2] == "offload"
model = tiny_llama()
rows = BATCH // world
losses = []
with tandem.Engine(model, engine_config(offload, **{"dist.backend": "gloo"})) as engine:
    for s in range(6):
        x, y = batch(s, slice(rank * rows, (rank + 1) * rows))
        loss = loss_of(model, x, y)
        engine.backward(loss)
        info = engine.step()
        losses.append(loss.item())
    world_size = engine.world_size
with open(f"{sys.argv[1]}.{rank}", "w") as f:
    json.dump({"losses": losses, "world": world_size}, f)
