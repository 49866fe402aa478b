"""tandem.optim.OffloadAdamW: the drop-in optimizer over the same engine."""

import pytest
import torch

import tandem
from models import CLIP, batch, engine_config, engine_losses, loss_of, tiny_gpt, tiny_llama


def test_drop_in_optimizer_equals_engine():
    model = tiny_llama()
    with tandem.Engine(model, engine_config(True)) as engine:
        ref, _ = engine_losses(model, engine, 10)
    model = tiny_llama()
    opt = tandem.optim.OffloadAdamW(model, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, max_grad_norm=CLIP,
                                    config={"train.device": "cpu", "monitor.enabled": False})
    ours = []
    for s in range(10):
        loss = loss_of(model, *batch(s))
        loss.backward()
        opt.step()
        opt.zero_grad()
        ours.append(loss.item())
    opt.engine.close()
    assert ours == ref


def test_drop_in_follows_torch_lr_scheduler():
    model = tiny_gpt()
    opt = tandem.optim.OffloadAdamW(model, lr=1e-2, config={"train.device": "cpu"})
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    lrs = []
    for s in range(5):
        loss_of(model, *batch(s)).backward()
        lrs.append(opt.step().lr)
        sched.step()
    opt.engine.close()
    assert lrs == pytest.approx([1e-2, 1e-2, 5e-3, 5e-3, 2.5e-3])
