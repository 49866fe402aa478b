"""The package as pip installs it (Note [Python package]): the wheel the test command built from this
build (`pip wheel --no-build-isolation`), installed into a fresh venv that has torch, imported and
trained from another directory."""

import glob
import os
import subprocess
import venv
from pathlib import Path

import pytest
import torch

TRAIN = """
import torch, tandem
from torch import nn

class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.layers = nn.ModuleList(Layer() for _ in range(3))
        self.head = nn.Linear(16, 32)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)

torch.manual_seed(0)
model = Net()
opt = tandem.optim.OffloadAdamW(model, lr=1e-2)
x = torch.randint(0, 32, (4, 8))
losses = []
for _ in range(5):
    loss = nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
    loss.backward()
    opt.step()
    losses.append(loss.item())
opt.engine.close()
print(tandem.__file__)
print(losses[0] > losses[-1])
"""


def test_the_wheel_installs_into_a_fresh_venv_and_trains_from_another_directory(tmp_path):
    wheels = glob.glob(os.path.join(os.environ.get("TANDEM_WHEEL_DIR", "build/wheel"), "tandem-*.whl"))
    if not wheels:
        pytest.skip("no wheel: scripts/test.sh builds it (pip wheel --no-build-isolation ...)")
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    py = str(env / "bin" / "python")
    site = subprocess.check_output([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   text=True).strip()
    # The venv has torch: this interpreter's, on its path (no 2 GB download), after its own site-packages.
    (Path(site) / "torch-of-the-tests.pth").write_text(os.path.dirname(os.path.dirname(torch.__file__)) + "\n")
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", "--no-index", wheels[0]],
                   check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run([py, "-c", TRAIN], cwd=elsewhere, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    where, fell = out.stdout.split()[-2:]
    assert where.startswith(site), where  # the fresh venv's copy, not the build tree's or the test venv's
    assert fell == "True", out.stdout
