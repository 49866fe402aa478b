"""Closed-loop load on an OpenAI-compatible server (`tandem serve`, or any other): N clients, each
sending its next request as soon as its last one is answered, for a duration or a request count.
Only the standard library (urllib and threads), so it runs wherever Python does.

    python3 bench/serve_load.py --url http://127.0.0.1:8000 --clients 64 --duration 60
    python3 bench/serve_load.py --checkpoint DIR [--tokenizer T] [--cli build/tandem] \\
        [--serve-args "--max-batch 64"] --clients 64 --requests 2000 --stream --json out.json
    python3 bench/serve_load.py --checkpoint DIR --mix --clients 64 --duration 30 --json out.json
    python3 bench/serve_load.py --table out.json ...     # one markdown row per file

--mix is the mixed load of a chat service (each request its own prompt of 20-400 tokens, cut from
--text at a random place, max_tokens drawn from 16-256, every other request streamed, temperature
0.7): unlike one prompt repeated, its prompts are prefilled, not found in the prefix cache. With
--checkpoint (or --tokenizer) the folder's tokenizer.json, read by `tokenizers` where installed,
cuts the prompts to whole token counts; otherwise a word stands for a token.

Prints one line and the JSON (also written to --json): requests/s, generated tokens/s (the sum of
the responses' usage.completion_tokens over the wall time), latency p50 and p99 (from sending a
request to its last byte) and, with --stream, time to first token p50 and p99 (to the first event
carrying text or the end). --checkpoint starts `tandem serve` on a free loopback port, waits for
/health, and stops it at the end; its output goes to --server-log. Any response other than 200, an
error event in a stream, a connection failure or a server that dies or exits badly fails the run:
the clients stop sending, the cause is printed and the exit code is 1.
"""

import argparse
import datetime
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import free_port  # noqa: E402
from load_prompts import PromptSource, PromptsUnavailable, default_text, int_range  # noqa: E402

DEFAULT_PROMPT = "the model trains on every tier of memory and serves text, client"


class LoadFailure(Exception):
    """A response that is not a success: the run is void."""


def percentile(values, q):
    """The q-th percentile (0..100) of `values`, linearly interpolated between the closest ranks."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def system_prompt(words):
    """A system prompt of `words` words every client's chat requests share (--system-words)."""
    vocab = "the model trains on every tier of memory and serves text layer by layer".split()
    return " ".join(vocab[i % len(vocab)] for i in range(words))


def body_of(args, text, max_tokens, stream, system_words=0):
    """The JSON body of one request for `text`."""
    body = {"max_tokens": max_tokens, "temperature": args.temperature}
    if args.ignore_eos:  # tandem's (and vLLM's) extension: every request generates max_tokens
        body["ignore_eos"] = True
    if args.model:
        body["model"] = args.model
    if args.endpoint == "chat":
        body["messages"] = ([{"role": "system", "content": system_prompt(system_words)}] if system_words
                            else []) + [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return json.dumps(body).encode()


def mixed_request(args, source, rng, number):
    """--mix: the JSON body of request `number` (counted over every client), whether it streams (the
    even-numbered ones), its prompt's length and its max_tokens, the last two drawn uniformly from
    their ranges with the client's `rng`."""
    n = rng.randint(*args.prompt_tokens)
    max_tokens = rng.randint(*args.max_tokens_range)
    stream = number % 2 == 0
    return body_of(args, source.prompt(rng, n), max_tokens, stream), stream, n, max_tokens


def request_body(args, client):
    """The JSON body of `client`'s requests."""
    return body_of(args, f"{args.prompt} {client}", args.max_tokens, args.stream, args.system_words)


def open_request(url, body, api_key, timeout):
    """POSTs `body`; the open response, or LoadFailure naming the status and the server's message."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        raise LoadFailure(f"HTTP {e.code} from {url}: {e.read().decode(errors='replace')[:500]}") from None
    except (urllib.error.URLError, OSError) as e:
        raise LoadFailure(f"no response from {url}: {e}") from None
    if resp.status != 200:
        raise LoadFailure(f"HTTP {resp.status} from {url}: {resp.read().decode(errors='replace')[:500]}")
    return resp


def whole_response(resp):
    """(completion tokens, None) of a whole response."""
    body = json.loads(resp.read())
    if "usage" not in body:
        raise LoadFailure(f"a response without usage: {json.dumps(body)[:500]}")
    return body["usage"]["completion_tokens"], None


def has_output(chunk):
    """Whether a stream chunk carries text or the end."""
    for c in chunk.get("choices", []):
        if c.get("text") or (c.get("delta") or {}).get("content") or c.get("finish_reason"):
            return True
    return False


def streamed_response(resp, t0):
    """(completion tokens, seconds to the first text) of a server-sent event stream."""
    tokens, first = None, None
    for raw in resp:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data:"):
            continue  # blank lines between events, ": waiting" comments
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            raise LoadFailure(f"an error event in the stream: {data[:500]}")
        if first is None and has_output(chunk):
            first = time.perf_counter() - t0
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    if tokens is None:
        raise LoadFailure("a stream without its usage chunk (stream_options.include_usage)")
    return tokens, first


class Load:
    """The clients' shared state: what they measured, when to stop, the first failure."""

    def __init__(self, args, source=None):
        self.args = args
        self.source = source  # --mix: where prompts come from
        self.url = args.url.rstrip("/") + ("/v1/chat/completions" if args.endpoint == "chat" else "/v1/completions")
        self.lock = threading.Lock()
        self.latencies, self.ttfts, self.tokens = [], [], 0
        # --mix: each finished request's drawn prompt length, the streamed ones, the max_tokens asked for
        self.prompt_lengths, self.streamed, self.asked = [], 0, 0
        self.started = 0
        self.failure = None
        self.deadline = None

    def take_one(self):
        """The number of the request a client may send now (0, 1, ... over all clients), or None when
        the count or the duration is reached."""
        with self.lock:
            if self.failure is not None:
                return None
            if self.args.requests and self.started >= self.args.requests:
                return None
            if not self.args.requests and time.perf_counter() >= self.deadline:
                return None
            self.started += 1
            return self.started - 1

    def client(self, i):
        body, stream, n, asked = request_body(self.args, i), self.args.stream, None, 0
        rng = random.Random(self.args.seed * 100003 + i)
        try:
            while (number := self.take_one()) is not None:
                if self.source is not None:
                    body, stream, n, asked = mixed_request(self.args, self.source, rng, number)
                t0 = time.perf_counter()
                with open_request(self.url, body, self.args.api_key, self.args.timeout) as resp:
                    tokens, ttft = streamed_response(resp, t0) if stream else whole_response(resp)
                with self.lock:
                    self.latencies.append(time.perf_counter() - t0)
                    self.tokens += tokens
                    if ttft is not None:
                        self.ttfts.append(ttft)
                    if n is not None:
                        self.prompt_lengths.append(n)
                        self.streamed += int(stream)
                        self.asked += asked
        except (LoadFailure, ValueError, KeyError, OSError) as e:
            with self.lock:
                if self.failure is None:
                    self.failure = f"client {i}: {e}"

    def run(self):
        threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(self.args.clients)]
        t0 = time.perf_counter()
        self.deadline = t0 + self.args.duration
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0


def summary(load, wall):
    a = load.args
    n = len(load.latencies)
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "url": a.url, "endpoint": a.endpoint, "stream": a.stream, "clients": a.clients, "max_tokens": a.max_tokens,
           "system_words": a.system_words, "ignore_eos": a.ignore_eos, "serve_args": a.serve_args if a.checkpoint else None,
           "temperature": a.temperature, "wall_s": wall, "requests": n, "requests_per_s": n / wall,
           "generated_tokens": load.tokens, "generated_tokens_per_s": load.tokens / wall,
           "latency_p50_s": percentile(load.latencies, 50), "latency_p99_s": percentile(load.latencies, 99)}
    if a.checkpoint and os.environ.get("TANDEM_DECODE_KERNELS"):  # the server's decode kernels, when set
        out["serve_env"] = "TANDEM_DECODE_KERNELS=" + os.environ["TANDEM_DECODE_KERNELS"]
    if a.mix:
        out["stream"] = "half"
        out["max_tokens"] = "{}-{}".format(*a.max_tokens_range)
        out["mix"] = {"prompt_tokens": list(a.prompt_tokens), "max_tokens": list(a.max_tokens_range),
                      "counted_in": load.source.counted, "streamed_requests": load.streamed,
                      "prompt_min": min(load.prompt_lengths), "prompt_max": max(load.prompt_lengths),
                      "prompt_mean": sum(load.prompt_lengths) / len(load.prompt_lengths),
                      "max_tokens_asked": load.asked}
    if a.stream or a.mix:
        out.update(ttft_p50_s=percentile(load.ttfts, 50), ttft_p99_s=percentile(load.ttfts, 99))
    return out


def one_line(s):
    how = " streamed" if s["stream"] is True else ""
    if s.get("mix"):
        m = s["mix"]
        how = (f" mixed (prompts of {m['prompt_tokens'][0]}-{m['prompt_tokens'][1]} {m['counted_in']}, max_tokens "
               f"{m['max_tokens'][0]}-{m['max_tokens'][1]}, {m['streamed_requests']} streamed, temperature "
               f"{s['temperature']:g})")
    line = (f"{s['clients']} clients, {s['endpoint']}{how}, {s['wall_s']:.1f} s: "
            f"{s['requests']} requests, {s['requests_per_s']:.2f} requests/s, "
            f"{s['generated_tokens_per_s']:.1f} generated tokens/s, latency p50 {s['latency_p50_s']:.3f} s "
            f"p99 {s['latency_p99_s']:.3f} s")
    if s.get("ttft_p50_s") is not None:
        line += f", time to first token p50 {s['ttft_p50_s']:.3f} s p99 {s['ttft_p99_s']:.3f} s"
    m = s.get("server", {}).get("metrics", {})
    if "tandem_serve_prefix_hit_tokens_total" in m:
        line += (f"; prompt tokens prefilled {m.get('tandem_serve_prompt_tokens_total', 0):.0f}, found in the prefix "
                 f"cache {m['tandem_serve_prefix_hit_tokens_total']:.0f}")
    return line


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        if r.status != 200:
            raise LoadFailure(f"HTTP {r.status} from {url}")
        return r.read().decode()


class Server:
    """`tandem serve` on a free loopback port, until stop()."""

    def __init__(self, args):
        self.port = free_port()
        self.temp_log = not args.server_log
        self.log_path = args.server_log or tempfile.mkstemp(prefix="serve-load-", suffix=".log")[1]
        cmd = [args.cli, "serve", "--checkpoint", args.checkpoint, "--host", "127.0.0.1", "--port", str(self.port)]
        if args.tokenizer:
            cmd += ["--tokenizer", args.tokenizer]
        if args.api_key:
            cmd += ["--api-key", args.api_key]
        cmd += shlex.split(args.serve_args)
        self.cmd = cmd
        if not os.access(args.cli, os.X_OK):
            raise LoadFailure(f"no tandem binary at {args.cli}; build it or give --cli")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def log_tail(self, n=15):
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def wait_healthy(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise LoadFailure(f"tandem serve exited with {self.proc.returncode}")
            try:
                if json.loads(get(self.url + "/health")).get("status") == "ok":
                    return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.2)
        raise LoadFailure(f"tandem serve did not answer /health within {timeout} s")

    def metrics(self):
        """The server's tandem_serve_* gauges and counters without labels."""
        out = {}
        for line in get(self.url + "/metrics").splitlines():
            name, _, value = line.partition(" ")
            if name.startswith("tandem_serve_") and "{" not in name and value:
                out[name] = float(value)
        return out

    def stop(self):
        """SIGTERM, then the exit code (SIGKILL after 60 s)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def table(paths):
    print("| endpoint | server flags | clients | max tokens | requests/s | generated tokens/s | latency p50 | "
          "latency p99 | TTFT p50 | TTFT p99 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        try:
            with open(path) as f:
                s = json.load(f)
        except (OSError, ValueError) as e:
            print(f"| {path}: no result ({e}) |")
            continue
        ttft = [f"{s[k]:.3f} s" if s.get(k) is not None else "" for k in ("ttft_p50_s", "ttft_p99_s")]
        system = f", system prompt {s['system_words']} words" if s.get("system_words") else ""
        system += ", ignore_eos" if s.get("ignore_eos") else ""
        flags = s.get("serve_args")
        flags = "(a running server)" if flags is None else f"`{flags.strip()}`" if flags.strip() else "(defaults)"
        if s.get("serve_env"):
            flags += f", `{s['serve_env']}`"
        how = " (mixed)" if s.get("mix") else " (stream)" if s["stream"] else ""
        print(f"| {s['endpoint']}{how}{system} | {flags} | {s['clients']} | "
              f"{s['max_tokens']} | "
              f"{s['requests_per_s']:.2f} | {s['generated_tokens_per_s']:.1f} | {s['latency_p50_s']:.3f} s | "
              f"{s['latency_p99_s']:.3f} s | {ttft[0]} | {ttft[1]} |")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print a markdown row per result file and exit")
    ap.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8000")
    ap.add_argument("--checkpoint", help="start `tandem serve --checkpoint DIR` on a free loopback port instead")
    ap.add_argument("--tokenizer", help="with --checkpoint: its --tokenizer")
    ap.add_argument("--cli", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "tandem"),
                    help="with --checkpoint: the tandem binary (default build/tandem)")
    ap.add_argument("--serve-args", default="", help="with --checkpoint: more flags for tandem serve, one string")
    ap.add_argument("--server-log", help="with --checkpoint: where the server's output goes (default a temp file)")
    ap.add_argument("--start-timeout", type=float, default=900, help="seconds to wait for /health (default 900)")
    ap.add_argument("--clients", type=int, default=64, help="concurrent clients (default 64)")
    ap.add_argument("--duration", type=float, default=60, help="seconds of sending (default 60)")
    ap.add_argument("--requests", type=int, default=0, help="requests in all, instead of --duration")
    ap.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    ap.add_argument("--stream", action="store_true", help="stream (server-sent events) and time the first token")
    ap.add_argument("--max-tokens", type=int, default=128, help="max_tokens of each request (default 128)")
    ap.add_argument("--temperature", type=float, help="temperature of each request (default 0; 0.7 with --mix)")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="ask for max_tokens tokens whatever the model samples (the server's ignore_eos)")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT, help="the prompt (the client's number is appended)")
    ap.add_argument("--system-words", type=int, default=0,
                    help="chat: a system prompt of this many words that every request shares (default none)")
    ap.add_argument("--model", default="", help="the request's model field (default none: the server's one)")
    ap.add_argument("--api-key", default=os.environ.get("TANDEM_API_KEY", ""), help="default $TANDEM_API_KEY")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one request may take (default 600)")
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--mix", action="store_true",
                    help="the mixed load (module doc): prompts of --prompt-tokens, max_tokens of --max-tokens-range, "
                         "every other request streamed")
    ap.add_argument("--prompt-tokens", type=int_range, default=(20, 400), metavar="LO-HI",
                    help="--mix: prompt lengths in tokens (default 20-400)")
    ap.add_argument("--max-tokens-range", type=int_range, default=(16, 256), metavar="LO-HI",
                    help="--mix: max_tokens of the requests (default 16-256)")
    ap.add_argument("--text", help="--mix: the text prompts are cut from (default this repository's README and docs)")
    ap.add_argument("--seed", type=int, default=0, help="--mix: seed of the draws (default 0)")
    args = ap.parse_args(argv)
    if args.temperature is None:
        args.temperature = 0.7 if args.mix else 0.0
    if args.mix and (args.system_words or args.stream):
        ap.error("--mix draws its own prompts and streams every other request: leave out --system-words and --stream")
    if not args.table and bool(args.url) == bool(args.checkpoint):
        ap.error("give --url of a running server or --checkpoint to start one (one of them)")
    if args.clients < 1 or args.requests < 0 or args.duration <= 0 or args.max_tokens < 1:
        ap.error("--clients and --max-tokens must be at least 1, --requests >= 0, --duration > 0")
    return args


def prompt_source(args):
    """--mix's prompts: from --text or the docs, cut by the served folder's tokenizer where it has one."""
    if args.text:
        try:
            with open(args.text, errors="replace") as f:
                text = f.read()
        except OSError as e:
            raise LoadFailure(f"--text {args.text}: {e.strerror}") from None
    else:
        text = default_text()
    where = args.tokenizer or args.checkpoint
    if where and not where.endswith(".json"):
        where = os.path.join(where, "tokenizer.json")
    try:
        return PromptSource(text, where)
    except PromptsUnavailable as e:
        raise LoadFailure(str(e)) from None


def measure(args, server):
    load = Load(args, prompt_source(args) if args.mix else None)
    wall = load.run()
    if load.failure is not None:
        raise LoadFailure(load.failure)
    if not load.latencies:
        raise LoadFailure("no request finished")
    s = summary(load, wall)
    if server is not None:
        s["server"] = {"command": shlex.join(server.cmd), "metrics": server.metrics()}
    return s


def main(argv=None):
    args = parse_args(argv)
    if args.table:
        table(args.table)
        return 0
    server = None
    try:
        if args.checkpoint:
            server = Server(args)
            server.wait_healthy(args.start_timeout)
            args.url = server.url
        s = measure(args, server)
    except LoadFailure as e:
        print(f"serve_load: failed: {e}", file=sys.stderr)
        if server is not None:
            server.stop()
            print(f"serve_load: the server's last lines ({server.log_path}):\n{server.log_tail()}", file=sys.stderr)
        return 1
    if server is not None:
        if server.stop() != 0:
            print(f"serve_load: tandem serve exited with {server.proc.returncode}; its last lines "
                  f"({server.log_path}):\n{server.log_tail()}", file=sys.stderr)
            return 1
        if server.temp_log:
            os.remove(server.log_path)
    print(one_line(s))
    print(json.dumps(s, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(s, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
