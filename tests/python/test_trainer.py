"""The loops people already have: transformers' Trainer with OffloadAdamW as its optimizer, against
the same Trainer with torch's AdamW (a tiny Llama on the CPU)."""

import pytest
import torch

import tandem
from models import VOCAB, tiny_llama

transformers = pytest.importorskip("transformers")


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, VOCAB, (16,), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}


def train(tmp_path, name, make_optimizer):
    torch.manual_seed(0)
    model = tiny_llama()
    opt = make_optimizer(model)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / name), per_device_train_batch_size=4, max_steps=6, learning_rate=3e-3,
        lr_scheduler_type="linear", warmup_steps=2, max_grad_norm=0.0,  # clipping is the optimizer's (max_grad_norm=)
        logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, seed=0, data_seed=0,
        dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(), optimizers=(opt, None))
    trainer.train()
    if isinstance(opt, tandem.optim.OffloadAdamW):
        opt.engine.close()
    return [row["loss"] for row in trainer.state.log_history if "loss" in row]


def test_trainer_with_offload_adamw_equals_trainer_with_torch_adamw(tmp_path):
    cpu = {"train.device": "cpu", "monitor.enabled": False}
    want = train(tmp_path, "torch", lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.01))
    got = train(tmp_path, "tandem",
                lambda m: tandem.optim.OffloadAdamW(m.parameters(), lr=3e-3, weight_decay=0.01, config=cpu))
    assert len(got) == 6
    assert got == pytest.approx(want, rel=1e-5)


def accelerate_losses(make_optimizer):
    """A plain accelerate loop (prepare, accelerator.backward, step, zero_grad) on the CPU."""
    accelerate = pytest.importorskip("accelerate")
    torch.manual_seed(0)
    model = tiny_llama()
    opt = make_optimizer(model)
    accelerator = accelerate.Accelerator(cpu=True)
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=4)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    losses = []
    for step, batch in enumerate(loader):
        if step == 5:
            break
        loss = model(**batch).loss
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, opt


def test_an_accelerate_loop_with_offload_adamw_equals_one_with_torch_adamw():
    want, _ = accelerate_losses(lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.01))
    got, opt = accelerate_losses(lambda m: tandem.optim.OffloadAdamW(
        m.parameters(), lr=3e-3, weight_decay=0.01, config={"train.device": "cpu", "monitor.enabled": False}))
    assert len(got) == 5
    assert got == pytest.approx(want, rel=1e-5)
    opt.optimizer.engine.close()  # accelerate wraps the optimizer: .optimizer is ours
