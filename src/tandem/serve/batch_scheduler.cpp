#include "tandem/serve/batch_scheduler.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <optional>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "tandem/core/device_graph.h"
#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/serve/text_stream.h"

namespace tandem {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One prefill, one decode step and a sampled token, on the thread that will run the steps: the
// first request then does not pay for lazy initialisation (kernels loaded, the thread's cuBLAS
// handle and workspace). Best effort: a failure here shows again, with its cause, in a real step.
void warm_up(Decoder& decoder, KvCache& cache) {
  PageTable a, b;
  if (cache.reserve(a, 3) && cache.reserve(b, 5)) {
    try {  // every attention path of Note [Generation forward]: prefills together, a decode, a continuation
      const std::vector<TokenId> none;
      SamplingParams sampled;
      sampled.top_k = 8, sampled.top_p = 0.9, sampled.repetition_penalty = 1.1;
      decoder.forward({{&a, 0, {0, 0}}, {&b, 0, {0, 0, 0}}}, cache);
      const auto logits = decoder.forward({{&a, 2, {0}}, {&b, 3, {0, 0}}}, cache);
      sample_tokens(logits, {{&sampled, &none, 0.5}, {&sampled, &none, 0.5}});
    } catch (const std::exception& e) {
      log::warn(std::string("generation warm-up failed: ") + e.what());
    }
  }
  cache.release(a);
  cache.release(b);
}

}  // namespace

const char* generation_end_name(GenerationEnd end) {
  switch (end) {
    case GenerationEnd::kEos:
      return "eos";
    case GenerationEnd::kStopString:
      return "stop";
    case GenerationEnd::kMaxTokens:
      return "length";
    case GenerationEnd::kContextFull:
      return "context";
    case GenerationEnd::kCancelled:
      return "cancelled";
    case GenerationEnd::kFailed:
      return "failed";
  }
  return "?";
}

/// A request's whole state; its fields beyond `cancelled` and `callback_mutex` belong to the
/// scheduler thread once submitted.
struct BatchScheduler::Request {
  uint64_t id = 0;
  GenerationRequest request;
  std::vector<TokenId> tokens;  // prompt, then generated
  int64_t prompt_tokens = 0, generated = 0;
  int64_t cached = 0;      // tokens whose keys and values are in the cache
  bool published = false;  // its prompt's pages are in the prefix cache (Note [Prefix cache])
  PageTable pages;
  SamplingRng rng;
  std::unique_ptr<TextStream> text;
  Clock::time_point submitted = Clock::now();
  double time_to_first_token_s = 0;
  bool done = false;
  std::atomic<bool> cancelled{false};
  std::recursive_mutex callback_mutex;  // held while its callback runs; cancel() takes it

  explicit Request(uint64_t seed) : rng(seed) {}
};

// On a GPU, the events of Note [Decode step split], made once.
struct BatchScheduler::StepEvents {
  c10::DeviceType type;
  c10::Event start, forwarded, sampled;
  explicit StepEvents(c10::DeviceType t)
      : type(t),
        start(t, c10::EventFlag::BACKEND_DEFAULT),
        forwarded(t, c10::EventFlag::BACKEND_DEFAULT),
        sampled(t, c10::EventFlag::BACKEND_DEFAULT) {}
  void record(c10::Event& e, c10::Device device) const {
    const c10::impl::VirtualGuardImpl impl(type);
    e.record(impl.getStream(device));
  }
};

BatchScheduler::BatchScheduler(Decoder& decoder, KvCache& cache, const Tokenizer* tokenizer, SchedulerOptions options)
    : decoder_(decoder), cache_(cache), tokenizer_(tokenizer), options_(std::move(options)) {
  TANDEM_CHECK(options_.max_batch >= 1, "--max-batch must be at least 1; got ", options_.max_batch);
  TANDEM_CHECK(options_.max_queue >= 0, "--max-queue must be >= 0; got ", options_.max_queue);
  TANDEM_CHECK(options_.max_step_tokens >= 1, "max_step_tokens must be at least 1; got ", options_.max_step_tokens);
  context_tokens_ = std::min(decoder_.spec().max_seq_len, cache_.tokens_total());
  counters_.max_queue = options_.max_queue;
  counters_.max_batch = options_.max_batch;
  // Note [Prefix cache]: a dynamic RoPE's keys depend on the sequence's length, not only its prefix.
  prefix_cache_ = options_.prefix_cache && decoder_.spec().rope_scaling.type != RopeType::kDynamic;
  std::promise<void> warm;
  auto warmed = warm.get_future();
  const bool record = options_.decode_graphs && decoder_.device().is_cuda() && graph_recorder() != nullptr &&
                      decoder_.weights().placement().plan.streamed() == 0;
  if (record) graphs_ = std::make_unique<DecodeGraphs>(decoder_, cache_, graph_recorder());
  thread_ = std::thread([this, &warm] {
    thread_id_ = std::this_thread::get_id();
    warm_up(decoder_, cache_);
    warm.set_value();
    loop();
  });
  warmed.wait();
}

BatchScheduler::~BatchScheduler() { stop(); }

Submission BatchScheduler::submit(GenerationRequest request) {
  const auto n = static_cast<int64_t>(request.prompt.size());
  TANDEM_CHECK(n > 0, "the prompt is empty; give at least one token");
  for (const TokenId t : request.prompt)
    TANDEM_CHECK(t >= 0 && t < decoder_.spec().vocab_size, "token id ", t, " is outside the model's vocabulary of ",
                 decoder_.spec().vocab_size, "; the tokenizer does not belong to this model (give --tokenizer)");
  TANDEM_CHECK(n < context_tokens_, "the prompt is ", n, " tokens but the context holds ", context_tokens_,
               " (prompt and output together",
               context_tokens_ < decoder_.spec().max_seq_len ? ", limited by the KV cache" : "",
               "); shorten the prompt");
  TANDEM_CHECK(request.max_tokens >= 0, "max_tokens must be >= 0; got ", request.max_tokens);
  check_sampling_params(request.sampling);
  const bool stops = std::any_of(request.stop.begin(), request.stop.end(), [](const auto& s) { return !s.empty(); });
  TANDEM_CHECK(!stops || tokenizer_ != nullptr, "stop strings need a tokenizer to decode the output");

  auto r = std::make_shared<Request>(request.sampling.seed);
  r->tokens = request.prompt;
  r->prompt_tokens = n;
  if (tokenizer_ != nullptr) r->text = std::make_unique<TextStream>(*tokenizer_, request.stop);
  r->request = std::move(request);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return {Admission::kStopped, 0};
    // A place in the running batch, or one of max_queue beyond them (max_queue 0: no waiting line).
    if (static_cast<int64_t>(live_.size()) >= options_.max_batch + options_.max_queue) {
      ++counters_.refused;
      return {Admission::kQueueFull, 0};
    }
    r->id = ++next_id_;
    waiting_.push_back(r);
    live_[r->id] = r;
    ++counters_.submitted;
  }
  wake_.notify_all();
  return {Admission::kAccepted, r->id};
}

void BatchScheduler::cancel(uint64_t id) {
  RequestPtr r;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = live_.find(id);
    if (it == live_.end()) return;
    r = it->second;
  }
  {
    std::lock_guard<std::recursive_mutex> callback(r->callback_mutex);  // waits for a running callback
    r->cancelled = true;
  }
  wake_.notify_all();
}

SchedulerStats BatchScheduler::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  SchedulerStats s = counters_;
  s.queued = static_cast<int64_t>(waiting_.size());
  s.running = static_cast<int64_t>(live_.size() - waiting_.size());  // admitted, not yet ended
  s.pages_total = cache_.pages_total();
  s.pages_used = cache_.pages_used();
  s.pages_cached = cache_.pages_cached();
  s.tokens_per_second = s.busy_seconds > 0 ? double(s.generated_tokens) / s.busy_seconds : 0;
  s.mean_time_to_first_token_s = ttft_count_ > 0 ? ttft_sum_s_ / double(ttft_count_) : 0;
  return s;
}

void BatchScheduler::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [&] { return live_.empty(); });
}

void BatchScheduler::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (std::this_thread::get_id() == thread_id_) return;  // from a callback: the loop ends after the step
  std::lock_guard<std::mutex> lock(join_mutex_);
  if (thread_.joinable()) thread_.join();
}

void BatchScheduler::loop() {
  std::vector<RequestPtr> running;  // in admission order
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !waiting_.empty() || !running.empty(); });
      if (stopping_) break;
    }
    step(running);
  }
  // Shutting down: every outstanding request ends as cancelled.
  std::deque<RequestPtr> waiting;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    waiting.swap(waiting_);
  }
  for (auto& r : running) finish(*r, GenerationEnd::kCancelled);
  for (auto& r : waiting) finish(*r, GenerationEnd::kCancelled);
}

void BatchScheduler::step(std::vector<RequestPtr>& running) {
  drop_cancelled(running);
  grow_running(running);
  admit(running);
  if (!running.empty()) run_step(running);
  running.erase(std::remove_if(running.begin(), running.end(), [](const RequestPtr& r) { return r->done; }),
                running.end());
}

void BatchScheduler::drop_cancelled(std::vector<RequestPtr>& running) {
  for (auto& r : running)
    if (r->cancelled) finish(*r, GenerationEnd::kCancelled);
  running.erase(std::remove_if(running.begin(), running.end(), [](const RequestPtr& r) { return r->done; }),
                running.end());
  std::vector<RequestPtr> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if ((*it)->cancelled) {
        dropped.push_back(*it);
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& r : dropped) finish(*r, GenerationEnd::kCancelled);
}

void BatchScheduler::preempt(RequestPtr r) {
  cache_.release(r->pages);
  r->cached = 0;
  r->published = false;
  std::lock_guard<std::mutex> lock(mutex_);
  waiting_.push_front(std::move(r));
  ++counters_.preempted;
}

// Note [Prefix cache]: a request not yet prefilled takes the cached pages of its prompt's longest
// cached prefix, all but the page of its last token; returns the tokens they hold.
int64_t BatchScheduler::share_prefix(Request& r) {
  if (!prefix_cache_ || r.cached > 0 || !r.pages.pages.empty()) return 0;
  r.cached = cache_.share_prefix(r.pages, r.tokens, static_cast<int64_t>(r.tokens.size()) - 1);
  return r.cached;
}

void BatchScheduler::grow_running(std::vector<RequestPtr>& running) {
  for (size_t i = 0; i < running.size(); ++i) {
    auto r = running[i];
    const auto need = static_cast<int64_t>(r->tokens.size());
    while (!cache_.reserve(r->pages, need)) {
      auto victim = running.back();  // the most recently admitted
      running.pop_back();
      preempt(victim);
      if (victim == r) break;
    }
  }
}

void BatchScheduler::admit(std::vector<RequestPtr>& running) {
  std::vector<RequestPtr> empty;  // max_tokens 0: nothing to compute
  int64_t budget = options_.max_step_tokens;
  bool first = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    while (!waiting_.empty() && static_cast<int64_t>(running.size()) < options_.max_batch) {
      auto r = waiting_.front();
      if (r->request.max_tokens == 0) {
        empty.push_back(r);
        waiting_.pop_front();
        continue;
      }
      if (!first && budget <= 0) break;  // Note [Chunked prefill]: the next step takes it
      const int64_t shared = share_prefix(*r);
      const auto n = static_cast<int64_t>(r->tokens.size()) - r->cached;
      if (!cache_.reserve(r->pages, static_cast<int64_t>(r->tokens.size()))) {
        if (shared > 0) cache_.release(r->pages), r->cached = 0;
        break;
      }
      counters_.prefix_hit_tokens += shared;
      waiting_.pop_front();
      running.push_back(r);
      budget -= n;
      first = false;
    }
  }
  for (auto& r : empty) finish(*r, GenerationEnd::kMaxTokens);
}

// Note [Decode step split]
// A decode step's wall time (the scheduler's clock) is split three ways on a GPU, for the summary of
// `tandem generate` and /metrics: the host's time until the forward is enqueued (layout, inputs,
// the launches or the graph's replay), and the device's time of the forward and of the sampling,
// from CUDA events on the current stream read after the sampling's copy to the host has waited
// for them. The device's times run from the start event, recorded before the forward's inputs are
// prepared, so the forward's includes the host's preparation when the GPU has nothing else queued.
// Steps that record a CUDA graph (capture, warm-up) are left out: they are the start's, not the
// steady state's.

// Note [Chunked prefill]
// A step prefills at most max_step_tokens prompt tokens, shared in admission order among the
// sequences still prefilling; one that gets fewer than its remaining tokens takes a chunk (from
// its first uncached token) and the rest in later steps, while the sequences that decode go on
// adding a token every step: a long prompt never stalls the running ones. A sequence whose chunk
// ends before its last known token gets no token this step (its logits row is not sampled and its
// sampling stream is not drawn from, so seeded output is the same however the prompt was cut);
// the step that prefills its last chunk samples its first token. Pages are reserved for the whole
// prompt at admission, as before.
void BatchScheduler::run_step(std::vector<RequestPtr>& running) {
  const auto t0 = Clock::now();
  std::vector<SequenceChunk> batch;
  std::vector<Request*> in_step;
  std::vector<bool> completes;  // the chunk reaches the sequence's last known token: sample it
  int64_t prefilled = 0, budget = options_.max_step_tokens;
  for (const auto& r : running) {
    const auto known = static_cast<int64_t>(r->tokens.size());
    const bool decoding = known - r->cached == 1 && r->generated > 0;
    const int64_t take = decoding ? 1 : std::min(known - r->cached, std::max<int64_t>(budget, 0));
    if (take == 0) continue;  // prefills in a later step
    SequenceChunk c;
    c.pages = &r->pages;
    c.start = r->cached;
    c.tokens.assign(r->tokens.begin() + r->cached, r->tokens.begin() + r->cached + take);
    if (!decoding) prefilled += take, budget -= take;
    batch.push_back(std::move(c));
    in_step.push_back(r.get());
    completes.push_back(r->cached + take == known);
  }
  if (batch.empty()) return;
  const bool decode_only = prefilled == 0;
  const c10::Device device = decoder_.device();
  const int64_t recordings_before = graphs_ ? graphs_->recordings() : 0;
  StepEvents* events = nullptr;  // Note [Decode step split]: made once, recorded every decode step
  if (decode_only && device.is_cuda()) {
    if (!step_events_) step_events_ = std::make_unique<StepEvents>(device.type());
    events = step_events_.get();
  }
  std::vector<TokenId> next;
  double enqueue_seconds = 0;
  try {
    if (events) events->record(events->start, device);
    const bool replay = graphs_ && graphs_->takes(batch);
    const auto logits = replay ? graphs_->forward(batch) : decoder_.forward(batch, cache_);  // (B, V) fp32
    enqueue_seconds = seconds_since(t0);
    if (events) events->record(events->forwarded, device);
    std::vector<SamplingRow> rows;
    for (size_t i = 0; i < in_step.size(); ++i)  // a partial chunk's row is sampled and dropped: no draw
      rows.push_back(
          {&in_step[i]->request.sampling, &in_step[i]->tokens, completes[i] ? in_step[i]->rng.uniform() : 0.5});
    next = sample_tokens(logits, rows);
    if (events) events->record(events->sampled, device), events->sampled.synchronize();
  } catch (const std::exception& e) {
    log::error(std::string("generation step failed: ") + e.what());
    for (auto& r : running) finish(*r, GenerationEnd::kFailed, e.what());
    return;
  }
  const auto delivered = std::count(completes.begin(), completes.end(), true);
  {  // counted before delivery: a waiter woken by the last request's end sees this step
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.steps;
    if (graphs_) counters_.replayed_steps = graphs_->replays(), counters_.recordings = graphs_->recordings();
    const double seconds = seconds_since(t0);
    counters_.busy_seconds += seconds;
    if (decode_only) ++counters_.decode_steps, counters_.decode_seconds += seconds;
    if (decode_only && (!graphs_ || graphs_->recordings() == recordings_before)) {  // Note [Decode step split]
      ++counters_.split_steps, counters_.split_seconds += seconds, counters_.split_enqueue_seconds += enqueue_seconds;
      if (events) {
        counters_.split_forward_device_seconds += events->start.elapsedTime(events->forwarded) / 1e3;
        counters_.split_sample_device_seconds += events->forwarded.elapsedTime(events->sampled) / 1e3;
      }
    }
    counters_.prompt_tokens += prefilled;
    counters_.generated_tokens += static_cast<int64_t>(delivered);
  }
  const auto t1 = Clock::now();
  for (size_t i = 0; i < in_step.size(); ++i) {
    Request& r = *in_step[i];
    r.cached += static_cast<int64_t>(batch[i].tokens.size());
    if (prefix_cache_ && !r.published && r.cached >= r.prompt_tokens) {  // Note [Prefix cache]
      cache_.publish_prefix(r.pages, r.tokens, r.prompt_tokens);
      r.published = true;
    }
    if (completes[i] && !r.cancelled) deliver(r, next[i]);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  counters_.delivery_seconds += seconds_since(t1);
}

void BatchScheduler::deliver(Request& r, TokenId token) {
  r.tokens.push_back(token);
  ++r.generated;
  if (r.generated == 1) {
    r.time_to_first_token_s = seconds_since(r.submitted);
    std::lock_guard<std::mutex> lock(mutex_);
    ttft_sum_s_ += r.time_to_first_token_s;
    ++ttft_count_;
    counters_.last_time_to_first_token_s = r.time_to_first_token_s;
  }
  GenerationEvent e;
  e.token = token;
  const auto& eos = options_.eos_ids;
  if (r.request.stop_at_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) {
    e.end = GenerationEnd::kEos;
  } else if (r.text) {
    e.text = r.text->push(token);
    if (r.text->stopped()) e.end = GenerationEnd::kStopString;
  }
  if (!e.end && r.generated >= r.request.max_tokens) e.end = GenerationEnd::kMaxTokens;
  if (!e.end && static_cast<int64_t>(r.tokens.size()) >= context_tokens_) e.end = GenerationEnd::kContextFull;
  if (e.end) {
    if (r.text) e.text += r.text->flush();
    finish(r, *e.end, "", &e);
    return;
  }
  e.prompt_tokens = r.prompt_tokens;
  e.generated_tokens = r.generated;
  e.time_to_first_token_s = r.time_to_first_token_s;
  emit(r, e);
}

void BatchScheduler::finish(Request& r, GenerationEnd end, const std::string& error, GenerationEvent* last) {
  if (r.done) return;
  r.done = true;
  cache_.release(r.pages);
  GenerationEvent e = last != nullptr ? *last : GenerationEvent{};
  e.end = end;
  e.error = error;
  e.prompt_tokens = r.prompt_tokens;
  e.generated_tokens = r.generated;
  e.time_to_first_token_s = r.time_to_first_token_s;
  if (last == nullptr && r.text && end != GenerationEnd::kFailed) e.text = r.text->flush();
  emit(r, e);  // a cancelled request's callback is skipped
  {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.erase(r.id);
    if (end == GenerationEnd::kCancelled)
      ++counters_.cancelled;
    else if (end == GenerationEnd::kFailed)
      ++counters_.failed;
    else
      ++counters_.finished;
    if (live_.empty()) idle_.notify_all();
  }
}

void BatchScheduler::emit(Request& r, const GenerationEvent& event) {
  std::lock_guard<std::recursive_mutex> callback(r.callback_mutex);
  if (r.cancelled || !r.request.on_event) return;
  try {
    r.request.on_event(event);
  } catch (const std::exception& e) {
    log::warn(std::string("a generation callback failed (the request is cancelled): ") + e.what());
    r.cancelled = true;
  }
}

}  // namespace tandem
