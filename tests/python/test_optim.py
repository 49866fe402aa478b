"""tandem.optim.OffloadAdamW: the drop-in optimizer over the same engine."""

import math

import pytest
import torch
from torch import nn

import tandem
from models import CLIP, batch, engine_config, engine_losses, loss_of, tiny_gpt, tiny_llama


def test_drop_in_optimizer_equals_engine():
    model = tiny_llama()
    # OffloadAdamW decays every parameter of its group, as torch's AdamW: the engine's optim.decay_1d.
    with tandem.Engine(model, engine_config(True, **{"optim.decay_1d": True})) as engine:
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


# torch.optim.AdamW's semantics, step for step (Note [Parameter groups]).

class Layer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)  # a bias: a 1-D parameter in a decayed group
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return x + torch.tanh(self.fc(self.norm(x)))


class Net(nn.Module):
    """Embedding, 3 layers, a bare scalar parameter and a head: every shape AdamW meets."""

    def __init__(self, vocab=32, d=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Layer(d) for _ in range(3))
        self.temperature = nn.Parameter(torch.tensor(1.5))
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h) / self.temperature


def net_pair():
    torch.manual_seed(0)
    a = Net()
    b = Net()
    b.load_state_dict(a.state_dict())
    return a, b


def groups_of(model):
    matrices = [p for n, p in model.named_parameters() if p.dim() >= 2]
    vectors = [p for n, p in model.named_parameters() if p.dim() == 1]
    return [{"params": matrices},
            {"params": vectors, "lr": 1e-3, "weight_decay": 0.05, "eps": 1e-6},
            {"params": [model.temperature], "lr": 5e-3, "betas": (0.8, 0.9), "weight_decay": 0.2}]


def net_loss(model, step):
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, 32, (4, 8), generator=g)
    return nn.functional.cross_entropy(model(x).flatten(0, 1), torch.roll(x, 1, 1).flatten())


def close(a, b, rtol=1e-6):
    assert torch.allclose(a, b, rtol=rtol, atol=1e-7), (a - b).abs().max()


def run(model, opt, steps, first=0, sched=None, between=None):
    losses = []
    for s in range(first, first + steps):
        if between:
            between(opt, s)
        loss = net_loss(model, s)
        loss.backward()
        opt.step()
        model.zero_grad()  # every gradient, a parameter in no group too
        if sched:
            sched.step()
        losses.append(loss.item())
    return losses


def final_params(model, opt):
    if isinstance(opt, tandem.optim.OffloadAdamW):
        opt.engine.wait()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


CPU = {"train.device": "cpu", "monitor.enabled": False}


def test_equals_torch_adamw_over_param_groups_schedulers_and_group_changes():
    ref_model, model = net_pair()
    ref = torch.optim.AdamW(groups_of(ref_model), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    opt = tandem.optim.OffloadAdamW(groups_of(model), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, config=CPU)

    def change(o, s):  # a group changed between steps: its weight decay and betas
        if s == 4:
            o.param_groups[1]["weight_decay"] = 0.0
            o.param_groups[0]["betas"] = (0.85, 0.99)

    sched_ref = torch.optim.lr_scheduler.LambdaLR(ref, lambda s: 1.0 / (1 + s))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    want = run(ref_model, ref, 8, sched=sched_ref, between=change)
    got = run(model, opt, 8, sched=sched, between=change)
    assert got == pytest.approx(want, rel=1e-6)
    expected, ours = final_params(ref_model, ref), final_params(model, opt)
    for name in expected:
        close(ours[name], expected[name])
    opt.engine.close()


def test_add_param_group_and_parameters_in_no_group():
    ref_model, model = net_pair()
    first = lambda m: [p for n, p in m.named_parameters() if not n.startswith("head")]
    ref = torch.optim.AdamW(first(ref_model), lr=3e-3)
    opt = tandem.optim.OffloadAdamW(first(model), lr=3e-3, model=model, config=CPU)
    run(ref_model, ref, 2)
    run(model, opt, 2)
    close(model.head.weight.detach(), ref_model.head.weight.detach())  # in no group: untouched as torch leaves it
    ref.add_param_group({"params": list(ref_model.head.parameters()), "lr": 1e-2})
    opt.add_param_group({"params": list(model.head.parameters()), "lr": 1e-2})
    want = run(ref_model, ref, 3, first=2)
    got = run(model, opt, 3, first=2)
    assert got == pytest.approx(want, rel=1e-6)
    expected, ours = final_params(ref_model, ref), final_params(model, opt)
    for name in expected:
        close(ours[name], expected[name])
    opt.engine.close()


def net_with(weights, config, lr=3e-3):
    """A Net holding `weights` and an OffloadAdamW over its groups."""
    model = Net()
    model.load_state_dict(weights)
    return model, tandem.optim.OffloadAdamW(groups_of(model), lr=lr, config=config)


def test_state_dict_round_trip_and_a_torch_state_dict():
    torch.manual_seed(0)
    straight = Net()
    start = {k: v.clone() for k, v in straight.state_dict().items()}
    opt = tandem.optim.OffloadAdamW(groups_of(straight), lr=3e-3, config=CPU)
    want = run(straight, opt, 6)
    opt.engine.close()

    first, opt = net_with(start, CPU)
    run(first, opt, 3)
    saved, weights = opt.state_dict(), {k: v.clone() for k, v in first.state_dict().items()}
    opt.engine.close()
    assert sorted(saved["state"]) == list(range(sum(len(g["params"]) for g in saved["param_groups"])))
    assert set(saved["state"][0]) == {"step", "exp_avg", "exp_avg_sq", "master"}
    assert float(saved["state"][0]["step"]) == 3

    second, opt = net_with(weights, CPU, lr=1.0)  # the state's lr wins
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["lr"] == 3e-3
    assert run(second, opt, 3, first=3) == want[3:]
    opt.engine.close()

    # A torch AdamW's state (no masters: the parameters are) continues as torch's would.
    ref_model, model = net_pair()
    ref = torch.optim.AdamW(groups_of(ref_model), lr=3e-3)
    run(ref_model, ref, 3)
    model.load_state_dict(ref_model.state_dict())
    opt = tandem.optim.OffloadAdamW(groups_of(model), lr=3e-3, config=CPU)
    opt.load_state_dict(ref.state_dict())
    assert run(model, opt, 3, first=3) == pytest.approx(run(ref_model, ref, 3, first=3), rel=1e-6)
    opt.engine.close()


def test_a_fresh_state_dict_is_empty_as_torchs_and_loads_back():
    # accelerate's optimizer wrapper (under transformers' Trainer) moves the state to the GPU when it
    # prepares the optimizer: before the first update there must be none to move, as with torch's.
    straight, model = net_pair()
    want = run(straight, torch.optim.AdamW(groups_of(straight), lr=3e-3), 3)
    opt = tandem.optim.OffloadAdamW(groups_of(model), lr=3e-3, config=CPU)
    fresh = opt.state_dict()
    assert fresh["state"] == {} and set(fresh) == {"state", "param_groups"}
    opt.load_state_dict(fresh)
    assert run(model, opt, 3) == pytest.approx(want, rel=1e-6)
    assert opt.state_dict()["state"]  # once updated, the state is there
    opt.engine.close()


def test_the_state_dict_holds_the_live_fp32_state_as_torchs_does():
    # No copy of the masters and moments (a Trainer checkpoint of a 7B model would need a second
    # 81 GiB): the state's tensors are the engine's, and they move on with the training.
    torch.manual_seed(0)
    model = Net()
    opt = tandem.optim.OffloadAdamW(groups_of(model), lr=3e-3, config=CPU)
    run(model, opt, 2)
    first = opt.state_dict()["state"][0]
    again = opt.state_dict()["state"][0]
    assert first["exp_avg"].data_ptr() == again["exp_avg"].data_ptr()
    assert first["master"].data_ptr() == again["master"].data_ptr()
    before = first["exp_avg"].clone()
    run(model, opt, 1, first=2)
    assert not torch.equal(first["exp_avg"], before)  # live, as torch.optim.AdamW's state
    opt.engine.close()
    assert torch.isfinite(first["master"]).all()  # the buffers outlive the engine while referenced


def resumes_from_its_state_dict(start, config, losses):
    """Four steps from `start`, then a new model and optimizer from the weights and the state_dict:
    steps 5-8 give `losses`' last four exactly. Returns the state_dict."""
    first, opt = net_with(start, config)
    run(first, opt, 4)
    saved, weights = opt.state_dict(), {k: v.clone() for k, v in first.state_dict().items()}
    opt.engine.close()
    second, opt = net_with(weights, config)
    opt.load_state_dict(saved)
    assert run(second, opt, 4, first=4) == losses[4:]
    opt.engine.close()
    return saved


def test_eight_bit_states_track_fp32_and_round_trip_their_state_dict():
    # optim.state_dtype=int8 (Note [8-bit states]): close to fp32 states but not the same, and a
    # state_dict (decoded to fp32, as torch's) resumes into the same run exactly. Every Block is
    # CPU-updated from the start (update_split=0): an adaptive split keeps a Block's states in fp32
    # while it is updated on the device, so a resumed run would quantise at other steps.
    q8 = dict(CPU, **{"optim.state_dtype": "int8", "offload.update_split": "0"})
    torch.manual_seed(0)
    start = Net().state_dict()
    losses = {}
    for name, config in (("fp32", CPU), ("int8", q8)):
        model, opt = net_with(start, config)
        losses[name] = run(model, opt, 8)
        opt.engine.close()
    assert losses["int8"] != losses["fp32"]
    assert losses["int8"] == pytest.approx(losses["fp32"], rel=1e-2)
    saved = resumes_from_its_state_dict(start, q8, losses["int8"])
    assert saved["state"][0]["exp_avg"].dtype == torch.float32


def test_a_bf16_master_tracks_fp32_and_round_trips_its_state_dict():
    # optim.master_dtype=bf16 (Note [bf16 master]), rounded stochastically or with Kahan's
    # compensation: close to the fp32 master but not the same; the state_dict holds the master in
    # fp32 (the bf16 value plus its compensation), and resumes into the same run exactly.
    torch.manual_seed(0)
    start = Net().state_dict()
    fixed = dict(CPU, **{"offload.update_split": "0"})
    model, opt = net_with(start, fixed)
    want = run(model, opt, 8)
    opt.engine.close()
    for rounding in ("stochastic", "kahan"):
        config = dict(fixed, **{"optim.master_dtype": "bf16", "optim.master_rounding": rounding})
        model, opt = net_with(start, config)
        losses = run(model, opt, 8)
        opt.engine.close()
        assert losses != want, rounding
        assert losses == pytest.approx(want, rel=2e-2), rounding
        saved = resumes_from_its_state_dict(start, config, losses)
        assert saved["state"][0]["master"].dtype == torch.float32


def test_the_nvme_tier_gives_the_same_steps_and_state_dict(tmp_path):
    # offload.nvme_path (Note [NVMe tier]): the last Blocks' Adam states in files, the same updates
    # bit for bit; its state_dict holds them as without the tier, and the files are gone with it.
    torch.manual_seed(0)
    start = Net().state_dict()
    plain = dict(CPU, **{"offload.update_split": "0", "offload.speculate": "never", "optim.state_dtype": "int8"})
    model, opt = net_with(start, plain)
    want = run(model, opt, 6)
    want_state = opt.state_dict()
    opt.engine.close()
    disk = tmp_path / "nvme"
    tier = dict(plain, **{"offload.nvme_path": str(disk), "offload.nvme_blocks": 2})
    model, opt = net_with(start, tier)
    assert run(model, opt, 6) == want
    got_state = opt.state_dict()
    for k, v in want_state["state"].items():
        for name, t in v.items():
            assert torch.equal(got_state["state"][k][name], t), (k, name)
    assert list(disk.iterdir()) == []
    opt.engine.close()


def test_a_second_backward_before_the_step_is_refused():
    _, model = net_pair()
    opt = tandem.optim.OffloadAdamW(model.parameters(), lr=3e-3, config=CPU)
    net_loss(model, 0).backward()
    with pytest.raises(ValueError, match="call opt.step\\(\\) .* after each backward"):
        net_loss(model, 1).backward()
    with torch.no_grad():  # evaluation between backward and step is fine
        net_loss(model, 2)
    assert opt.step().step == 1
    loss = net_loss(model, 3)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="a second backward into .* before the optimizer's step"):
        loss.backward()  # through the retained graph: refused too, never a race
    opt.engine.close()


class Shared(nn.Module):
    """ALBERT's shape: one layer applied at every depth."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.layer = Layer(16)
        self.head = nn.Linear(16, 32)

    def forward(self, x):
        h = self.embed(x)
        for _ in range(3):
            h = self.layer(h)
        return self.head(h)


def test_frozen_and_shared_layers_train_as_torch_does():
    torch.manual_seed(0)
    ref_model, model = Shared(), Shared()
    model.load_state_dict(ref_model.state_dict())
    ref = torch.optim.AdamW(ref_model.parameters(), lr=3e-3)
    opt = tandem.optim.OffloadAdamW(model.parameters(), lr=3e-3, config=CPU)
    assert run(model, opt, 4) == pytest.approx(run(ref_model, ref, 4), rel=1e-6)
    opt.engine.close()

    ref_model, model = net_pair()
    for m in (ref_model, model):
        m.layers[0].requires_grad_(False)  # fine-tuning: the first layer frozen
    ref = torch.optim.AdamW([p for p in ref_model.parameters() if p.requires_grad], lr=3e-3)
    opt = tandem.optim.OffloadAdamW(model, lr=3e-3, config=CPU)
    assert run(model, opt, 4) == pytest.approx(run(ref_model, ref, 4), rel=1e-6)
    close(model.layers[0].fc.weight.detach(), ref_model.layers[0].fc.weight.detach(), 0.0)
    opt.engine.close()


def test_a_skipped_step_is_logged_and_in_step_info(capfd):
    _, model = net_pair()
    with tandem.Engine(model, engine_config(True)) as engine:
        loss = net_loss(model, 0) * float("nan")
        engine.backward(loss)
        info = engine.step()
    assert info.skipped and math.isnan(info.loss)
    assert "step 1 skipped: non-finite gradients" in capfd.readouterr().err
