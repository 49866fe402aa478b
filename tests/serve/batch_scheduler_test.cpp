// Continuous batching: batched outputs equal the same requests run alone, a cache too small for the
// batch makes requests wait (preempted and recomputed) rather than fail, many submissions and
// cancellations from several threads all end exactly once and leave every page free, a full queue
// is a distinct refusal, stop strings and EOS end a sequence, and stop() ends what is outstanding.

#include "tandem/serve/batch_scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <thread>

#include "../test_util.h"
#include "serve_test_util.h"
#include "tandem/data/byte_tokenizer.h"

namespace tandem {
namespace {

/// A random model, its decoder and a cache of `pages` pages of 4 tokens.
struct Rig {
  std::shared_ptr<Model> model;
  std::unique_ptr<Decoder> decoder;
  std::unique_ptr<KvCache> cache;
  Rig(int64_t pages, int64_t vocab = 61, c10::Device device = c10::kCPU) {
    model = test::random_llama(test::small_llama_spec(vocab), 21);
    decoder = test::decoder_of(*model, torch::kFloat32, -1, 1, device);
    cache = std::make_unique<KvCache>(decoder->cache_shape(4), pages * decoder->cache_shape(4).page_bytes());
  }
};

/// What one request received.
struct Record {
  std::mutex mutex;
  std::vector<TokenId> tokens;
  std::string text;
  std::vector<GenerationEnd> ends;
  std::atomic<uint64_t> id{0};
  std::atomic<bool> cancel_returned{false};
  bool event_after_cancel = false;

  GenerationCallback callback() {
    return [this](const GenerationEvent& e) {
      std::lock_guard<std::mutex> lock(mutex);
      if (cancel_returned) event_after_cancel = true;
      if (e.token) tokens.push_back(*e.token);
      text += e.text;
      if (e.end) ends.push_back(*e.end);
    };
  }
};

GenerationRequest request(std::vector<TokenId> prompt, int64_t max_tokens, double temperature, uint64_t seed) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.top_k = 10;
  r.sampling.seed = seed;
  return r;
}

std::vector<TokenId> prompt_of(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TokenId> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<TokenId>(rng() % vocab));
  return p;
}

// Six requests of different lengths, greedy and sampled; run alone one after another, then all at
// once: the same tokens.
void expect_batched_equals_alone(c10::Device device) {
  Rig rig(200, 61, device);
  BatchScheduler s(*rig.decoder, *rig.cache, nullptr, {});
  const int n = 6;
  const auto make = [&](int i) {
    return request(prompt_of(1 + 4 * i, 61, static_cast<uint32_t>(i)), 5 + 2 * i, i % 2 == 0 ? 0.0 : 0.9, 100 + i);
  };
  std::vector<Record> alone(n), together(n);
  for (int i = 0; i < n; ++i) {
    auto r = make(i);
    r.on_event = alone[i].callback();
    ASSERT_EQ(s.submit(std::move(r)).admission, Admission::kAccepted);
    s.wait_idle();
  }
  for (int i = 0; i < n; ++i) {
    auto r = make(i);
    r.on_event = together[i].callback();
    ASSERT_EQ(s.submit(std::move(r)).admission, Admission::kAccepted);
  }
  s.wait_idle();
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(alone[i].tokens.size(), static_cast<size_t>(5 + 2 * i));
    EXPECT_EQ(together[i].ends, std::vector<GenerationEnd>{GenerationEnd::kMaxTokens});
  }
  const auto st = s.stats();
  EXPECT_EQ(st.pages_used, 0);
  EXPECT_EQ(st.finished, 2 * n);
  EXPECT_GT(st.tokens_per_second, 0);
  EXPECT_GT(st.mean_time_to_first_token_s, 0);
}

TEST(ServeBatchScheduler, BatchedOutputsEqualTheSameRequestsRunAlone) { expect_batched_equals_alone(c10::kCPU); }

TEST(ServeBatchSchedulerGpu, BatchedOutputsEqualTheSameRequestsRunAloneOnCuda) {
  REQUIRE_CUDA();
  expect_batched_equals_alone(c10::Device(c10::kCUDA, 0));
}

// Note [Chunked prefill]: with a prefill budget of 3 tokens a step, the same six requests (prompts of
// 1 to 21 tokens, greedy and seeded sampling) give the same tokens as with the default budget, and
// the greedy ones the tokens of the model's full forward without a cache.
TEST(ServeBatchScheduler, ChunkedPrefillGivesTheTokensOfWholePrefillsAndOfTheFullForward) {
  Rig rig(200);
  const int n = 6;
  const auto make = [&](int i) {
    return request(prompt_of(1 + 4 * i, 61, static_cast<uint32_t>(i)), 5 + 2 * i, i % 2 == 0 ? 0.0 : 0.9, 100 + i);
  };
  std::vector<Record> whole(n), chunked(n);
  for (auto* records : {&whole, &chunked}) {
    SchedulerOptions o;
    if (records == &chunked) o.max_step_tokens = 3;
    BatchScheduler s(*rig.decoder, *rig.cache, nullptr, o);
    for (int i = 0; i < n; ++i) {
      auto r = make(i);
      r.on_event = (*records)[i].callback();
      ASSERT_EQ(s.submit(std::move(r)).admission, Admission::kAccepted);
    }
    s.wait_idle();
    EXPECT_EQ(s.stats().pages_used, 0);
  }
  torch::NoGradGuard no_grad;
  rig.model->eval();
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(chunked[i].tokens, whole[i].tokens) << "request " << i;
    EXPECT_EQ(chunked[i].tokens.size(), static_cast<size_t>(5 + 2 * i));
    if (i % 2 != 0) continue;  // greedy: each token the argmax of the full forward over all before it
    const auto prompt = make(i).prompt;
    std::vector<int64_t> seq(prompt.begin(), prompt.end());
    for (const TokenId t : chunked[i].tokens) {
      const auto logits = rig.model->forward(torch::tensor(seq).view({1, -1}));
      EXPECT_EQ(logits[0][-1].narrow(0, 0, 61).argmax().item<int64_t>(), t) << "request " << i;
      seq.push_back(t);
    }
  }
}

// A 40-token prompt prefilled 4 tokens a step takes 10 steps; the sequence already decoding gets a
// token in every one of them, so it has at least 9 before the long one's first.
TEST(ServeBatchScheduler, ALongPromptNeverStallsTheRunningSequences) {
  Rig rig(200);
  SchedulerOptions o;
  o.max_step_tokens = 4;
  BatchScheduler s(*rig.decoder, *rig.cache, nullptr, o);
  Record running, long_one;
  std::mutex mutex;
  std::vector<size_t> long_tokens_seen;  // at each of the running one's tokens
  std::atomic<int> running_tokens{0};
  auto a = request(prompt_of(2, 61, 1), 50, 0.0, 1);
  a.on_event = [&](const GenerationEvent& e) {
    if (!e.token) return;
    ++running_tokens;
    std::lock_guard<std::mutex> lock(mutex);
    std::lock_guard<std::mutex> other(long_one.mutex);
    long_tokens_seen.push_back(long_one.tokens.size());
  };
  ASSERT_EQ(s.submit(std::move(a)).admission, Admission::kAccepted);
  while (running_tokens < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto b = request(prompt_of(40, 61, 2), 3, 0.0, 2);
  b.on_event = long_one.callback();
  ASSERT_EQ(s.submit(std::move(b)).admission, Admission::kAccepted);
  s.wait_idle();
  ASSERT_EQ(long_one.tokens.size(), 3u);
  const auto before_first = std::count(long_tokens_seen.begin(), long_tokens_seen.end(), size_t{0});
  EXPECT_GE(before_first, 2 + 9) << "the running sequence stalled while the long prompt prefilled";
}

// Note [Prefix cache]: requests sharing a 21-token prefix, one after another and then all at once,
// greedy and seeded sampling, give the same tokens with the prefix cache as without it, in a cache
// large enough to keep every prefix and in one so small that cached pages are reused for others.
void expect_prefix_cache_changes_no_token(int64_t pages) {
  Rig rig(pages);
  const auto shared = prompt_of(21, 61, 7);
  const int n = 8;
  const auto make = [&](int i) {
    auto p = shared;
    const auto own = prompt_of(1 + i, 61, static_cast<uint32_t>(50 + i));
    p.insert(p.end(), own.begin(), own.end());
    return request(p, 6, i % 2 == 0 ? 0.0 : 0.9, 200 + i);
  };
  std::map<bool, std::vector<Record>> got;
  std::map<bool, SchedulerStats> stats;
  for (const bool on : {false, true}) {
    SchedulerOptions o;
    o.prefix_cache = on;
    BatchScheduler s(*rig.decoder, *rig.cache, nullptr, o);
    auto& records = got[on];
    records = std::vector<Record>(2 * n);
    for (int i = 0; i < 2 * n; ++i) {
      auto r = make(i % n);
      r.on_event = records[static_cast<size_t>(i)].callback();
      ASSERT_EQ(s.submit(std::move(r)).admission, Admission::kAccepted);
      if (i < n) s.wait_idle();  // the first round one after another, the second all at once
    }
    s.wait_idle();
    stats[on] = s.stats();
    EXPECT_EQ(stats[on].pages_used, 0);
  }
  for (int i = 0; i < 2 * n; ++i) {
    EXPECT_EQ(got[true][static_cast<size_t>(i)].tokens, got[false][static_cast<size_t>(i)].tokens) << "request " << i;
    EXPECT_EQ(got[true][static_cast<size_t>(i)].tokens.size(), 6u);
  }
  EXPECT_EQ(stats[false].prefix_hit_tokens, 0);
  EXPECT_GT(stats[true].prefix_hit_tokens, 0);
  EXPECT_LT(stats[true].prompt_tokens, stats[false].prompt_tokens);
  torch::NoGradGuard no_grad;
  rig.model->eval();
  const auto p = make(0).prompt;  // greedy, with the prefix shared: the full forward's tokens
  std::vector<int64_t> seq(p.begin(), p.end());
  for (const TokenId t : got[true][static_cast<size_t>(n)].tokens) {
    EXPECT_EQ(rig.model->forward(torch::tensor(seq).view({1, -1}))[0][-1].narrow(0, 0, 61).argmax().item<int64_t>(), t);
    seq.push_back(t);
  }
}

TEST(ServeBatchScheduler, ThePrefixCacheChangesNoToken) { expect_prefix_cache_changes_no_token(200); }

TEST(ServeBatchScheduler, ThePrefixCacheChangesNoTokenWhenItsPagesAreReused) {
  expect_prefix_cache_changes_no_token(20);  // 80 tokens: two or three sequences at a time
}

// 4 sequences that each need 7 pages, in a cache of 10: they take turns (preempted, recomputed) and
// each gives what it gives alone.
TEST(ServeBatchScheduler, OutOfPagesWaitsAndRecomputes) {
  Rig rig(10);
  std::vector<std::vector<TokenId>> alone(4);
  {
    BatchScheduler s(*rig.decoder, *rig.cache, nullptr, {});
    EXPECT_EQ(s.context_tokens(), 40);  // the cache, smaller than the model's context
    for (int i = 0; i < 4; ++i) {
      Record rec;
      auto r = request(prompt_of(8, 61, 50 + i), 20, 0.7, i);
      r.on_event = rec.callback();
      s.submit(std::move(r));
      s.wait_idle();
      alone[i] = rec.tokens;
    }
  }
  BatchScheduler s(*rig.decoder, *rig.cache, nullptr, {});
  std::vector<Record> recs(4);
  for (int i = 0; i < 4; ++i) {
    auto r = request(prompt_of(8, 61, 50 + i), 20, 0.7, i);
    r.on_event = recs[i].callback();
    ASSERT_EQ(s.submit(std::move(r)).admission, Admission::kAccepted);
  }
  s.wait_idle();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(recs[i].tokens, alone[i]) << "request " << i;
    EXPECT_EQ(recs[i].ends, std::vector<GenerationEnd>{GenerationEnd::kMaxTokens});
  }
  const auto st = s.stats();
  EXPECT_GT(st.preempted, 0);
  EXPECT_EQ(st.pages_used, 0);
  EXPECT_EQ(st.failed, 0);
}

TEST(ServeBatchScheduler, ManyThreadsSubmitAndCancelAndNothingIsLost) {
  Rig rig(24);
  SchedulerOptions o;
  o.max_batch = 8, o.max_queue = 1000;
  BatchScheduler s(*rig.decoder, *rig.cache, nullptr, o);
  const int threads = 4, per_thread = 30, n = threads * per_thread;
  std::vector<Record> recs(n);
  std::vector<int64_t> max_tokens(n);
  std::vector<std::thread> workers;
  std::vector<uint64_t> later;  // cancelled by a third party
  std::mutex later_mutex;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int j = 0; j < per_thread; ++j) {
        const int i = t * per_thread + j;
        max_tokens[i] = 1 + rng() % 16;
        auto r = request(prompt_of(1 + rng() % 12, 61, i), max_tokens[i], i % 3 == 0 ? 0.0 : 1.0, i);
        auto& rec = recs[i];
        const auto inner = rec.callback();
        r.on_event = [&rec, &s, inner, i](const GenerationEvent& e) {
          inner(e);
          if (i % 5 == 2 && e.token && !e.end && rec.id != 0) {  // cancel from its own callback
            s.cancel(rec.id);
            rec.cancel_returned = true;
          }
        };
        const auto sub = s.submit(std::move(r));
        ASSERT_EQ(sub.admission, Admission::kAccepted);
        rec.id = sub.id;
        if (i % 5 == 1) {
          s.cancel(sub.id);
          rec.cancel_returned = true;
        }
        if (i % 5 == 3) {
          std::lock_guard<std::mutex> lock(later_mutex);
          later.push_back(sub.id);
        }
        if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }
  std::thread canceller([&] {
    for (int k = 0; k < 40; ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::vector<uint64_t> ids;
      {
        std::lock_guard<std::mutex> lock(later_mutex);
        ids.swap(later);
      }
      for (const auto id : ids) s.cancel(id);
    }
  });
  for (auto& w : workers) w.join();
  canceller.join();
  s.wait_idle();
  int completed = 0;
  for (int i = 0; i < n; ++i) {
    auto& r = recs[i];
    std::lock_guard<std::mutex> lock(r.mutex);
    EXPECT_FALSE(r.event_after_cancel) << "request " << i << " got an event after cancel() returned";
    EXPECT_LE(r.ends.size(), 1u) << "request " << i;
    if (r.ends.empty()) {
      EXPECT_TRUE(i % 5 == 1 || i % 5 == 2 || i % 5 == 3) << "request " << i << " never ended";
      continue;
    }
    ++completed;
    EXPECT_EQ(r.ends[0], GenerationEnd::kMaxTokens) << "request " << i;
    EXPECT_EQ(static_cast<int64_t>(r.tokens.size()), max_tokens[i]) << "request " << i;
  }
  const auto st = s.stats();
  EXPECT_EQ(st.submitted, n);
  EXPECT_EQ(st.finished, completed);
  EXPECT_EQ(st.finished + st.cancelled, n);
  EXPECT_EQ(st.queued, 0);
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.pages_used, 0);
  EXPECT_EQ(rig.cache->pages_free(), rig.cache->pages_total());
}

// max_queue 0: no waiting line, but every place in the running batch is taken.
TEST(ServeBatchScheduler, NoWaitingLineStillFillsTheBatch) {
  Rig rig(100);
  SchedulerOptions o;
  o.max_batch = 2, o.max_queue = 0;
  BatchScheduler s(*rig.decoder, *rig.cache, nullptr, o);
  const auto a = s.submit(request({1, 2}, 90, 0.0, 0)), b = s.submit(request({3}, 90, 0.0, 0));
  EXPECT_EQ(a.admission, Admission::kAccepted);
  EXPECT_EQ(b.admission, Admission::kAccepted);
  EXPECT_EQ(s.submit(request({4}, 5, 0.0, 0)).admission, Admission::kQueueFull);
  s.cancel(a.id);
  s.cancel(b.id);
  s.wait_idle();
  EXPECT_EQ(s.submit(request({5}, 3, 0.0, 0)).admission, Admission::kAccepted);
  s.wait_idle();
  EXPECT_EQ(s.stats().refused, 1);
  EXPECT_EQ(s.stats().finished, 1);
}

TEST(ServeBatchScheduler, AFullQueueIsADistinctRefusal) {
  Rig rig(100);
  SchedulerOptions o;
  o.max_batch = 1, o.max_queue = 2;
  BatchScheduler s(*rig.decoder, *rig.cache, nullptr, o);
  std::atomic<int> first_tokens{0};
  auto long_one = request({1, 2, 3}, 90, 0.0, 0);
  long_one.on_event = [&](const GenerationEvent&) { ++first_tokens; };
  const auto a = s.submit(std::move(long_one));
  ASSERT_EQ(a.admission, Admission::kAccepted);
  while (first_tokens == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // it is running
  const auto b = s.submit(request({4}, 5, 0.0, 0)), c = s.submit(request({5}, 5, 0.0, 0));
  EXPECT_EQ(b.admission, Admission::kAccepted);
  EXPECT_EQ(c.admission, Admission::kAccepted);
  EXPECT_EQ(s.submit(request({6}, 5, 0.0, 0)).admission, Admission::kQueueFull);
  EXPECT_EQ(s.stats().refused, 1);
  EXPECT_EQ(s.stats().queued, 2);
  s.cancel(a.id);
  s.wait_idle();
  EXPECT_EQ(s.stats().finished, 2);
  EXPECT_EQ(s.stats().cancelled, 1);
}

TEST(ServeBatchScheduler, MalformedRequestsAreRefusedAtSubmit) {
  Rig rig(8);  // 32 tokens of cache
  BatchScheduler s(*rig.decoder, *rig.cache, nullptr, {});
  EXPECT_NE(test::error_of([&] { s.submit(request({}, 5, 0, 0)); }).find("empty"), std::string::npos);
  EXPECT_NE(test::error_of([&] { s.submit(request({61}, 5, 0, 0)); }).find("outside the model's vocabulary"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { s.submit(request(std::vector<TokenId>(32, 1), 5, 0, 0)); }).find("shorten"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { s.submit(request({1}, -1, 0, 0)); }).find("max_tokens"), std::string::npos);
  EXPECT_NE(test::error_of([&] { s.submit(request({1}, 1, -0.5, 0)); }).find("temperature"), std::string::npos);
  auto with_stop = request({1}, 1, 0, 0);
  with_stop.stop = {"x"};
  EXPECT_NE(test::error_of([&] { s.submit(with_stop); }).find("tokenizer"), std::string::npos);
  EXPECT_EQ(s.stats().submitted, 0);
  // A sequence that reaches the context ends there.
  Record r;
  auto fill = request(std::vector<TokenId>(30, 1), 10, 0, 0);
  fill.on_event = r.callback();
  s.submit(std::move(fill));
  s.wait_idle();
  EXPECT_EQ(r.tokens.size(), 2u);
  EXPECT_EQ(r.ends, std::vector<GenerationEnd>{GenerationEnd::kContextFull});
}

// A byte model (vocabulary 128: ASCII text) with the byte tokenizer: a stop string cuts the text
// before it, EOS ends at its token.
TEST(ServeBatchScheduler, StopStringsAndEosEndASequence) {
  Rig rig(100, 128);
  const ByteTokenizer tok;
  const auto run = [&](std::vector<std::string> stop, std::vector<TokenId> eos) {
    SchedulerOptions o;
    o.eos_ids = std::move(eos);
    BatchScheduler s(*rig.decoder, *rig.cache, &tok, o);
    auto rec = std::make_unique<Record>();
    auto r = request(tok.encode("Once upon a time"), 24, 0.0, 0);
    r.stop = std::move(stop);
    r.on_event = rec->callback();
    s.submit(std::move(r));
    s.wait_idle();
    return rec;
  };
  const auto free_run = run({}, {});
  ASSERT_EQ(free_run->tokens.size(), 24u);
  const std::string text(free_run->tokens.begin(), free_run->tokens.end());
  EXPECT_EQ(free_run->text, text);
  const std::string stop = text.substr(5, 2);
  const auto stopped = run({"never there", stop}, {});
  EXPECT_EQ(stopped->text, text.substr(0, text.find(stop)));
  EXPECT_EQ(stopped->ends, std::vector<GenerationEnd>{GenerationEnd::kStopString});
  EXPECT_EQ(stopped->tokens.size(), text.find(stop) + stop.size());
  const TokenId eos = free_run->tokens[3];
  const auto at_eos = run({}, {eos});
  const size_t first = text.find(static_cast<char>(eos));
  EXPECT_EQ(at_eos->tokens.size(), first + 1);
  EXPECT_EQ(at_eos->text, text.substr(0, first));
  EXPECT_EQ(at_eos->ends, std::vector<GenerationEnd>{GenerationEnd::kEos});
}

TEST(ServeBatchScheduler, StopEndsOutstandingRequestsAsCancelled) {
  Rig rig(100);
  SchedulerOptions o;
  o.max_batch = 2;
  auto s = std::make_unique<BatchScheduler>(*rig.decoder, *rig.cache, nullptr, o);
  std::vector<Record> recs(4);
  for (auto& rec : recs) {
    auto r = request({1, 2}, 80, 0.0, 0);
    r.on_event = rec.callback();
    s->submit(std::move(r));
  }
  s->stop();
  EXPECT_EQ(s->submit(request({1}, 1, 0, 0)).admission, Admission::kStopped);
  for (auto& rec : recs) EXPECT_EQ(rec.ends, std::vector<GenerationEnd>{GenerationEnd::kCancelled});
  EXPECT_EQ(rig.cache->pages_used(), 0);
  s.reset();  // a second stop (the destructor's) is harmless
}

}  // namespace
}  // namespace tandem
