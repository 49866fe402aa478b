"""The examples in examples/python run as their users run them, and what they save loads back."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(script, *args):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "python", script), *args],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r.stdout


def test_nanogpt_example_trains_and_saves(tmp_path):
    out = run("nanogpt.py", "--steps", "12", "--offload")
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", out)]
    assert len(losses) >= 2 and losses[-1] < losses[0], out
    assert "saved" in out and "checkpoints/step_00000012" in out


def test_finetune_llama_example_writes_a_transformers_folder(tmp_path):
    import transformers

    out = run("finetune_llama.py", "--steps", "3", "--seq-len", "32", "--batch", "2", "--out", str(tmp_path / "ft"))
    path = re.search(r"checkpoint: (\S+)", out).group(1)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    assert model.config.num_hidden_layers == 4
