"""Every connection to `tandem serve` gets an HTTP answer, and a stop loses nothing in flight
(Note [Graceful drain]): SIGTERM under load with the `openai` client (every request answered, every
stream ended by its finish or an error event), the drain timeout cutting what still runs, 429 over
capacity, 413 for a body over --max-body-mib (unread when the client asks first; a chunked one too),
405 for a wrong method (an unknown one too), and connections read as they come when idle ones hold
the server's threads (Note [Connection pool])."""

import http.client
import json
import signal
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

import openai  # test-only packages, installed into .venv by scripts/setup.sh

from llama_folder import write_llama_folder
from test_serve import Server

CONTEXT = 1024


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_llama_folder(tmp_path_factory.mktemp("tiny-llama-long"), CONTEXT, seed=0, all_bytes=True)


def ask(client, stream, max_tokens):
    """One request; its outcome: "ok" (a whole answer, or a stream that ended with its finish
    reason), "503", "429", "cut" (a stream ended by the server's error event), or the exception."""
    try:
        if stream:
            finish = None
            for chunk in client.completions.create(model="", prompt="the model", max_tokens=max_tokens, stream=True,
                                                   extra_body={"ignore_eos": True}):
                finish = chunk.choices[0].finish_reason or finish
            return "ok" if finish else "truncated stream"
        r = client.completions.create(model="", prompt="the model", max_tokens=max_tokens,
                                      extra_body={"ignore_eos": True})
        return "ok" if r.choices[0].finish_reason else "no finish reason"
    except openai.RateLimitError:
        return "429"
    except openai.InternalServerError as e:
        return "503" if e.status_code == 503 else repr(e)
    except openai.APIError as e:
        return "cut" if "drain timeout" in str(e) else repr(e)
    except Exception as e:  # noqa: BLE001 - every other outcome is a failure the test names
        return repr(e)


def post(url, body, headers=None):
    """(status, headers, JSON body) of a POST, whatever the status."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read())


def load(server, clients, max_tokens, until):
    """`clients` closed-loop clients, half streaming, until `until()`; their outcomes, each with the
    time it ended."""
    outcomes, lock = [], threading.Lock()

    def one(i):
        client = server.client()
        while not until():
            outcome = ask(client, i % 2 == 0, max_tokens)
            with lock:
                outcomes.append((outcome, time.time()))
            if outcome == "503":
                return

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    return threads, outcomes


def stop_under_load(s, clients, max_tokens, load_s):
    """`clients` closed-loop clients for `load_s` seconds, then SIGTERM: their outcomes, once the
    server has exited with 0."""
    signalled = threading.Event()
    threads, outcomes = load(s, clients, max_tokens, signalled.is_set)
    time.sleep(load_s)
    s.proc.send_signal(signal.SIGTERM)
    signalled.set()
    for t in threads:
        t.join(timeout=120)
    assert s.proc.wait(timeout=60) == 0, "".join(s.lines[-20:])
    return [o for o, _ in outcomes]


def test_sigterm_under_load_answers_every_request_and_exits_0(model_dir):
    s = Server(model_dir, "--max-batch", "4", "--max-queue", "64")
    signalled = threading.Event()
    threads, outcomes = load(s, 24, 120, signalled.is_set)
    time.sleep(2)
    t_signal = time.time()
    s.proc.send_signal(signal.SIGTERM)
    signalled.set()
    deadline = time.time() + 10
    while not any("new requests get 503" in line for line in s.lines) and time.time() < deadline:
        time.sleep(0.01)
    # While the requests in flight finish, new ones are refused with 503 and Retry-After.
    status, headers, body = post(s.url + "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 2}).encode())
    assert status == 503 and headers["Retry-After"] and "shutting down" in body["error"]["message"], (status, body)
    health = urllib.request.Request(s.url + "/health")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(health, timeout=10)
    assert e.value.code == 503
    for t in threads:
        t.join()
    assert s.proc.wait(timeout=60) == 0, "".join(s.lines[-20:])
    kinds = [o for o, _ in outcomes]
    assert set(kinds) <= {"ok", "503"}, [k for k in kinds if k not in ("ok", "503")][:5]
    finished_after = sum(1 for o, t in outcomes if o == "ok" and t > t_signal)
    assert finished_after > 0, "no request in flight was finished after the signal"
    assert any("drained: every request in flight was answered" in line for line in s.lines), "".join(s.lines[-10:])


def test_the_drain_timeout_cuts_what_still_runs_with_an_answer(model_dir):
    s = Server(model_dir, "--max-batch", "1", "--max-queue", "64", "--drain-timeout", "0.3")
    kinds = stop_under_load(s, 12, 900, 1.5)
    assert set(kinds) <= {"ok", "503", "cut"}, [k for k in kinds if k not in ("ok", "503", "cut")][:5]
    assert "cut" in kinds or "503" in kinds, kinds
    assert any("the drain timeout cut" in line for line in s.lines), "".join(s.lines[-10:])


def test_over_capacity_every_connection_gets_200_or_429(model_dir):
    s = Server(model_dir, "--max-batch", "1", "--max-queue", "1")
    try:
        stop = time.time() + 6
        threads, outcomes = load(s, 48, 40, lambda: time.time() > stop)
        for t in threads:
            t.join()
        kinds = [o for o, _ in outcomes]
        assert set(kinds) <= {"ok", "429"}, [k for k in kinds if k not in ("ok", "429")][:5]
        assert "429" in kinds and "ok" in kinds
    finally:
        assert s.stop() == 0


def test_a_body_over_the_limit_gets_413_and_a_wrong_method_405(model_dir):
    s = Server(model_dir, "--max-body-mib", "1")
    try:
        big = json.dumps({"prompt": "x" * (3 << 20), "max_tokens": 1}).encode()
        status, _, body = post(s.url + "/v1/completions", big)
        assert status == 413 and "--max-body-mib" in body["error"]["message"], (status, body)
        # A client that asks first never sends the body: the answer comes before it.
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as c:
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 52428800\r\nExpect: 100-continue\r\n\r\n")
            head = c.recv(4096).decode()
        assert head.startswith("HTTP/1.1 413"), head
        # The connection after a refused body still serves.
        client = s.client()
        assert client.completions.create(model="", prompt="the", max_tokens=2).choices[0].text is not None
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(s.url + "/v1/completions", timeout=10)
        assert e.value.code == 405 and e.value.headers["Allow"] == "POST"
        assert "use POST" in json.loads(e.value.read())["error"]["message"]
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(s.url + "/metrics", data=b"{}"), timeout=10)
        assert e.value.code == 405 and e.value.headers["Allow"] == "GET"
    finally:
        assert s.stop() == 0


def test_a_chunked_body_over_the_limit_gets_413_and_an_unknown_method_405(model_dir):
    s = Server(model_dir, "--max-body-mib", "1")
    try:
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        body = json.dumps({"prompt": "x" * (1536 << 10), "max_tokens": 1}).encode()
        pieces = (body[i:i + 65536] for i in range(0, len(body), 65536))
        c.request("POST", "/v1/completions", body=pieces, encode_chunked=True,
                  headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        r = c.getresponse()
        answer = json.loads(r.read())
        assert r.status == 413 and "--max-body-mib" in answer["error"]["message"], (r.status, answer)
        # Note [Body limit]: the rest of the chunks were read and dropped, so the connection serves on.
        c.request("POST", "/v1/completions", body=json.dumps({"prompt": "the", "max_tokens": 1}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200, (r.status, r.read())
        r.read()
        # A chunked body within the limit is served.
        small = json.dumps({"prompt": "the model", "max_tokens": 1}).encode()
        c.request("POST", "/v1/completions", body=iter([small[:5], small[5:]]), encode_chunked=True,
                  headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        r = c.getresponse()
        assert r.status == 200 and json.loads(r.read())["choices"], r.status
        c.close()
        # A method HTTP has no name for, on a served path: 405 with Allow, as a wrong method.
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        c.request("FOO", "/v1/chat/completions")
        r = c.getresponse()
        assert r.status == 405 and r.getheader("Allow") == "POST", r.status
        assert "use POST" in json.loads(r.read())["error"]["message"]
        c.close()
    finally:
        assert s.stop() == 0


def test_requests_are_read_at_once_while_idle_connections_hold_the_threads(model_dir):
    # 1 + 1 + 8 = 10 threads to start with (serve_command); 24 idle connections hold more than that.
    s = Server(model_dir, "--max-batch", "1", "--max-queue", "1")
    idle = [socket.create_connection(("127.0.0.1", s.port), timeout=30) for _ in range(24)]
    try:
        time.sleep(0.5)  # each is taken by a worker, which waits for a request line (5 s)
        client = s.client()
        t0 = time.time()
        for _ in range(4):
            assert client.completions.create(model="", prompt="the", max_tokens=1).choices
        took = time.time() - t0
        assert took < 4, f"4 requests took {took:.1f} s behind idle connections"
        # A stop now answers what is in flight and refuses the rest; none is closed unanswered.
        kinds = stop_under_load(s, 8, 40, 1.0)
        assert kinds and set(kinds) <= {"ok", "503", "429"}, [k for k in kinds if k not in ("ok", "503", "429")][:5]
    finally:
        for c in idle:
            c.close()
        if s.proc.poll() is None:
            s.stop()
