"""The decoder families as their users meet them: a transformers folder of each family (saved by
transformers, with a tokenizer written by `tokenizers`) served by `tandem serve` answers the `openai`
client with transformers' own greedy text, `tandem generate` prints the same, and `tandem train
--init-from` trains it with the offload engine into a checkpoint that transformers loads and
continues as tandem does."""

import os
import subprocess

import pytest
import torch

import tokenizers  # test-only packages, installed into .venv by scripts/setup.sh
import transformers

from llama_folder import CLI, write_model_folder
from test_serve import Server

SHAPES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=96)
FAMILIES = {
    "qwen2": ("Qwen2Config", dict(SHAPES, use_sliding_window=True, sliding_window=6, max_window_layers=1)),
    "mistral": ("MistralConfig", dict(SHAPES, sliding_window=6)),
    "gemma2": ("Gemma2Config", dict(SHAPES, head_dim=24, sliding_window=6, attn_logit_softcapping=20.0,
                                    final_logit_softcapping=15.0, query_pre_attn_scalar=24)),
    "phi3": ("Phi3Config", dict(SHAPES, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                          "partial_rotary_factor": 0.5})),
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=3, n_head=4, n_positions=96)),
}
# On a GPU: fp32 (bf16 would change greedy picks) with recorded decode steps, launched eagerly, and with
# layers streamed from pinned host memory through a device budget of 1.2 MiB.
RUNS = {"cpu": ["--device", "cpu"]}
if torch.cuda.is_available():
    RUNS.update({"cuda": ["--device", "cuda", "--dtype", "fp32"],
                 "cuda-eager": ["--device", "cuda", "--dtype", "fp32", "--eager"],
                 "cuda-streamed": ["--device", "cuda", "--dtype", "fp32", "--gpu-memory-gib", "0.0012"]})
PROMPT = "the model trains on every"
NEW = 20


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def folder(request, tmp_path_factory):
    config_class, config = FAMILIES[request.param]
    return write_model_folder(tmp_path_factory.mktemp(request.param), config_class, config, seed=3, all_bytes=False)


def hf_greedy_text(model_dir, prompt, n):
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    ids = tok.encode(prompt).ids
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, top_p=None, top_k=None,
                             temperature=None, pad_token_id=0)
    new = out[0, len(ids):].tolist()
    eot = tok.token_to_id("<|eot_id|>")
    return tok.decode(new[:new.index(eot)] if eot in new else new)


@pytest.mark.parametrize("run", sorted(RUNS))
def test_serve_answers_with_transformers_greedy_text(folder, run):
    want = hf_greedy_text(folder, PROMPT, NEW)
    server = Server(folder, *RUNS[run])
    try:
        client = server.client()
        got = client.completions.create(model=client.models.list().data[0].id, prompt=PROMPT, max_tokens=NEW,
                                        temperature=0)
        assert got.choices[0].text == want
    finally:
        assert server.stop() == 0, "".join(server.lines[-20:])


@pytest.mark.parametrize("run", sorted(RUNS))
def test_generate_prints_transformers_greedy_text(folder, run):
    want = hf_greedy_text(folder, PROMPT, NEW)
    r = subprocess.run([CLI, "generate", "--checkpoint", str(folder), *RUNS[run], "--prompt", PROMPT,
                        "--max-tokens", str(NEW)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n") == PROMPT + want or r.stdout.rstrip("\n") == want, (r.stdout, want)


@pytest.mark.parametrize("device", ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
def test_offload_training_writes_a_checkpoint_transformers_continues(folder, tmp_path, device):
    vocab = transformers.AutoConfig.from_pretrained(str(folder)).vocab_size
    tokens = torch.randint(0, vocab, (6000,), generator=torch.Generator().manual_seed(0)).to(torch.int32)
    data = tmp_path / "tokens.bin"
    data.write_bytes(tokens.to(torch.int16).numpy().tobytes())
    run = tmp_path / "run"
    r = subprocess.run([CLI, "train", "--device", device, "--steps", "3", "--init-from", str(folder), "--run-dir",
                        str(run), "--set", "offload.optimizer=cpu", "--set", f"data.path={data}", "--set",
                        "train.seq_len=32", "--set", "train.micro_batch=2", "--set", "train.eval_every=0",
                        "--set", "monitor.enabled=false", "--set", "train.progress=off"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    ckpt = run / "checkpoints" / "step_00000003"
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert (ckpt / f).exists(), f"{f} was not carried into the checkpoint"
    want = hf_greedy_text(ckpt, PROMPT, NEW)
    g = subprocess.run([CLI, "generate", "--checkpoint", str(ckpt), "--device", "cpu", "--prompt", PROMPT,
                        "--max-tokens", str(NEW)], capture_output=True, text=True, timeout=300)
    assert g.returncode == 0, g.stderr
    assert want in g.stdout, (g.stdout, want)
