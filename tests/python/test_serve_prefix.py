"""The prefix cache as a chat user meets it (Note [Prefix cache]): conversations that share a long
system prompt get the same greedy answers from `tandem serve` with the cache as with
--no-prefix-cache, asked one after another and all at once, and /metrics shows the system prompt's
tokens found in the cache instead of prefilled again."""

import threading

import pytest

from llama_folder import write_llama_folder
from test_serve import Server

SYSTEM = ("You answer questions about the model, the memory tiers and the cores it trains on. " * 8).strip()
QUESTIONS = [f"Which tier holds layer {i}?" for i in range(6)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_llama_folder(tmp_path_factory.mktemp("tiny-llama-prefix"), 1024, seed=0, all_bytes=True)


def answers(server):
    client = server.client()

    def ask(q):
        r = client.chat.completions.create(model="", messages=[{"role": "system", "content": SYSTEM},
                                                               {"role": "user", "content": q}],
                                           max_tokens=12, temperature=0)
        return r.choices[0].message.content

    one_by_one = [ask(q) for q in QUESTIONS]
    together = [None] * len(QUESTIONS)

    def put(i):
        together[i] = ask(QUESTIONS[i])

    threads = [threading.Thread(target=put, args=(i,)) for i in range(len(QUESTIONS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return one_by_one, together


def test_a_shared_system_prompt_is_prefilled_once_and_changes_no_answer(model_dir):
    results = {}
    for name, args in (("cached", []), ("plain", ["--no-prefix-cache"])):
        s = Server(model_dir, "--device", "cpu", *args)
        try:
            results[name] = answers(s)
            results[name + "-metrics"] = s.metrics()
        finally:
            assert s.stop() == 0
    assert results["cached"] == results["plain"]
    one_by_one, together = results["cached"]
    assert one_by_one == together
    cached, plain = results["cached-metrics"], results["plain-metrics"]
    assert plain["tandem_serve_prefix_hit_tokens_total"] == 0
    # Every request after the first finds at least a page of the system prompt; what it finds it
    # does not prefill.
    hits = cached["tandem_serve_prefix_hit_tokens_total"]
    assert hits >= (2 * len(QUESTIONS) - 1) * 16, cached
    assert cached["tandem_serve_prompt_tokens_total"] + hits == plain["tandem_serve_prompt_tokens_total"]
    assert cached["tandem_serve_kv_pages_cached"] > 0
