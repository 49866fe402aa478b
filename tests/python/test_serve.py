"""`tandem serve` as its users meet it: the `openai` client against the server, on loopback, over a
transformers Llama folder with a byte-level BPE tokenizer written by `tokenizers`. The text the
server generates greedily must equal transformers' own greedy generation from the same folder."""

import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

import openai  # test-only packages, installed into .venv by scripts/setup.sh
import tokenizers
import transformers

from llama_folder import CLI, write_llama_folder

CONTEXT = 96


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama with a trained byte-level BPE tokenizer and a Llama-3 chat template."""
    return write_llama_folder(tmp_path_factory.mktemp("tiny-llama"), CONTEXT, seed=0, all_bytes=True)


class Server:
    def __init__(self, model_dir, *args):
        self.proc = subprocess.Popen([CLI, "serve", "--checkpoint", str(model_dir), "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                threading.Thread(target=self._drain, daemon=True).start()
                return
        self.proc.kill()
        raise AssertionError("the server did not start:\n" + "".join(self.lines))

    def _drain(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def client(self, key="none"):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120)

    def metrics(self):
        text = urllib.request.urlopen(self.url + "/metrics", timeout=30).read().decode()
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(tandem_serve_\w+) (\S+)$", text, re.M)}

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return self.proc.returncode


@pytest.fixture(scope="module")
def server(model_dir):
    s = Server(model_dir, "--max-batch", "16", "--max-queue", "512")
    yield s
    assert s.stop() == 0, "".join(s.lines[-20:])


def hf_greedy(model_dir, prompt_ids, n):
    model = transformers.LlamaForCausalLM.from_pretrained(str(model_dir))
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, top_p=None, top_k=None,
                         temperature=None)
    return out[0, len(prompt_ids):].tolist()


def test_greedy_completion_equals_transformers(server, model_dir):
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    prompt = "the model trains on every"
    want_ids = hf_greedy(model_dir, tok.encode(prompt).ids, 20)
    eot = tok.token_to_id("<|eot_id|>")
    if eot in want_ids:
        want_ids = want_ids[:want_ids.index(eot)]
    want = tok.decode(want_ids)
    client = server.client()
    got = client.completions.create(model=client.models.list().data[0].id, prompt=prompt, max_tokens=20,
                                    temperature=0)
    assert got.choices[0].text == want
    assert got.usage.prompt_tokens == len(tok.encode(prompt).ids)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=got.model, prompt=prompt, max_tokens=20, temperature=0, stream=True))
    assert streamed == want


def test_chat_streams_in_the_llama3_layout(server, model_dir):
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "serves text"}]
    prompt = "<|begin_of_text|>" + "".join(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>"
                                           for m in messages) + "<|start_header_id|>assistant<|end_header_id|>\n\n"
    want_ids = hf_greedy(model_dir, tok.encode(prompt).ids, 12)
    eot = tok.token_to_id("<|eot_id|>")
    finish = "length"
    if eot in want_ids:
        want_ids, finish = want_ids[:want_ids.index(eot)], "stop"
    client = server.client()
    whole = client.chat.completions.create(model="", messages=messages, max_tokens=12, temperature=0)
    assert whole.choices[0].message.content == tok.decode(want_ids)
    assert whole.choices[0].finish_reason == finish
    chunks = list(client.chat.completions.create(model="", messages=messages, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == tok.decode(want_ids)
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_sampling_repeats_for_a_seed_and_stop_strings_cut(server):
    client = server.client()
    args = dict(model="", prompt="tandem streams", max_tokens=16, temperature=1.0, top_p=0.9, seed=7)
    a = client.completions.create(**args).choices[0].text
    assert client.completions.create(**args).choices[0].text == a
    full = client.completions.create(model="", prompt="tandem streams", max_tokens=16, temperature=0).choices[0]
    word = re.search(r"[a-z]{2,}", full.text)
    assert word, f"no word to stop at in {full.text!r}"
    cut = client.completions.create(model="", prompt="tandem streams", max_tokens=16, temperature=0,
                                    stop=[word.group(0)])
    assert cut.choices[0].text == full.text[:word.start()]
    assert cut.choices[0].finish_reason == "stop"


def test_bad_requests_are_openai_errors_and_the_server_keeps_serving(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="", prompt="x", max_tokens=-1)
    with pytest.raises(openai.BadRequestError, match="wizardry"):
        client.completions.create(model="", prompt="x", extra_body={"wizardry": 1})
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model="", prompt="the model " * 200, max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-nothing", prompt="x")
    req = urllib.request.Request(server.url + "/v1/chat/completions", data=b"{\"messages\": [", method="POST",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400 and "JSON" in json.loads(e.value.read())["error"]["message"]
    assert client.completions.create(model="", prompt="the", max_tokens=2).choices[0].text is not None


def test_a_client_leaving_mid_stream_frees_its_pages(server):
    before = server.metrics()
    sock = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({"prompt": "the model", "max_tokens": 90, "stream": True, "temperature": 0}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while b"data:" not in received:
        received += sock.recv(4096)
    sock.close()  # gone after the first tokens
    deadline = time.time() + 30
    while time.time() < deadline:
        m = server.metrics()
        if m["tandem_serve_running_requests"] == 0:
            break
        time.sleep(0.05)
    assert m["tandem_serve_running_requests"] == 0
    assert m["tandem_serve_kv_pages_used"] == before["tandem_serve_kv_pages_used"] == 0
    # Cancelled, unless the whole answer was generated before the connection closed.
    ended = lambda x: x["tandem_serve_cancelled_requests_total"] + x["tandem_serve_finished_requests_total"]  # noqa: E731
    assert ended(m) == ended(before) + 1


def test_a_few_hundred_concurrent_requests_lose_none_and_leak_nothing(server):
    client = server.client()
    want = client.completions.create(model="", prompt="every tier", max_tokens=8, temperature=0).choices[0].text
    results, errors = [], []

    def one(i):
        try:
            if i % 3 == 0:
                text = "".join(c.choices[0].text for c in client.completions.create(
                    model="", prompt="every tier", max_tokens=8, temperature=0, stream=True))
            else:
                text = client.completions.create(model="", prompt="every tier", max_tokens=8,
                                                 temperature=0).choices[0].text
            results.append(text)
        except Exception as e:  # noqa: BLE001 - every failure is reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(300)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert len(results) == 300 and set(results) == {want}
    m = server.metrics()
    assert m["tandem_serve_kv_pages_used"] == 0 and m["tandem_serve_running_requests"] == 0
    assert m["tandem_serve_queued_requests"] == 0
    # The body is valid exposition text for Prometheus' own checker (where it is installed).
    if shutil.which("promtool"):
        text = urllib.request.urlopen(server.url + "/metrics", timeout=30).read()
        check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True)
        assert check.returncode == 0, check.stdout + check.stderr
        assert b'tandem_serve_http_responses_total{route="/v1/completions",status="200"}' in text


def test_a_full_queue_answers_429(model_dir):
    # One place and no waiting line (--max-queue 0): a request that meets another running is refused.
    s = Server(model_dir, "--max-batch", "1", "--max-queue", "0")
    try:
        client = s.client()
        outcomes = []

        start = threading.Barrier(32)

        def one():
            start.wait()
            try:
                client.completions.create(model="", prompt="the", max_tokens=90, temperature=0)
                outcomes.append("ok")
            except openai.RateLimitError:
                outcomes.append("429")
            except Exception as e:  # noqa: BLE001 - any other outcome fails the test below
                outcomes.append(repr(e))

        threads = [threading.Thread(target=one) for _ in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert set(outcomes) == {"ok", "429"}, outcomes
        assert client.completions.create(model="", prompt="the", max_tokens=2).choices[0].text is not None
    finally:
        assert s.stop() == 0


def test_api_key(model_dir):
    s = Server(model_dir, "--api-key", "k3y")
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        assert s.client("k3y").models.list().data[0].id
    finally:
        assert s.stop() == 0
