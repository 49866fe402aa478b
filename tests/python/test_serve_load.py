"""bench/serve_load.py's mixed load (--mix) against `tandem serve` on the CPU: each request its own
prompt of a drawn length cut by the folder's tokenizer, max_tokens drawn from its range, every other
request streamed; what it reports is what the server answered."""

import json
import os
import subprocess
import sys

import pytest

from llama_folder import CLI, write_llama_folder

LOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "serve_load.py")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_llama_folder(tmp_path_factory.mktemp("tiny-llama-load"), 512, seed=0, all_bytes=True)


def run_load(model_dir, tmp_path, *extra):
    out = tmp_path / "load.json"
    r = subprocess.run([sys.executable, LOAD, "--checkpoint", str(model_dir), "--cli", CLI, "--serve-args",
                        "--device cpu", "--clients", "3", "--requests", "12", "--json", str(out), *extra],
                       capture_output=True, text=True, timeout=600)
    return r, (json.loads(out.read_text()) if out.exists() else None)


def test_the_mixed_load_draws_its_prompts_and_streams_half(model_dir, tmp_path):
    r, s = run_load(model_dir, tmp_path, "--mix", "--prompt-tokens", "20-60", "--max-tokens-range", "4-12")
    assert r.returncode == 0, r.stderr
    m = s["mix"]
    assert s["requests"] == 12 and m["streamed_requests"] == 6
    assert m["counted_in"] == "tokens"  # the folder's tokenizer.json cut the prompts
    assert 20 <= m["prompt_min"] <= m["prompt_max"] <= 60 and m["prompt_min"] < m["prompt_max"]
    assert s["temperature"] == pytest.approx(0.7)
    # Every request generated at least one token and at most its max_tokens (fewer where EOS came).
    assert 12 <= s["generated_tokens"] <= m["max_tokens_asked"] <= 12 * 12
    assert s["ttft_p50_s"] is not None and s["ttft_p99_s"] >= s["ttft_p50_s"]
    metrics = s["server"]["metrics"]
    # Distinct prompts: most of what was asked for was prefilled, not found in the prefix cache.
    prefilled = metrics["tandem_serve_prompt_tokens_total"]
    assert prefilled > metrics["tandem_serve_prefix_hit_tokens_total"]
    assert "mixed (prompts of 20-60 tokens, max_tokens 4-12, 6 streamed, temperature 0.7)" in r.stdout


def test_a_bad_range_and_a_clash_are_refused_with_one_line(model_dir, tmp_path):
    r, _ = run_load(model_dir, tmp_path, "--mix", "--prompt-tokens", "60-20")
    assert r.returncode == 2 and "1 <= LO <= HI" in r.stderr
    r, _ = run_load(model_dir, tmp_path, "--mix", "--stream")
    assert r.returncode == 2 and "leave out --system-words and --stream" in r.stderr
