#pragma once
// Continuous batching: one thread owns the decoder and the KV cache; requests join the running
// batch (their prompt is prefilled) at any decode step when pages allow, and leave it as soon as they
// finish or are cancelled, their pages freed for the next. Callers on any thread submit requests
// with a callback that receives each new token (and its text) and the end.
//
// Note [Continuous batching]
// Each step the scheduler thread (1) drops cancelled requests and frees their pages, (2) grows every
// running sequence's page table by the token it decodes next, preempting the most recently admitted
// sequences when pages run out (their pages freed, their prompt and output so far queued at the
// front, to be prefilled again: recomputation), (3) admits waiting requests in order while the batch
// has room, their pages fit and the step's prefill budget (max_step_tokens) is not spent (the first
// one always), (4) runs one forward over the decodes and the prefills together, a prompt beyond the
// budget in chunks over several steps (Note [Chunked prefill]; Note [Generation
// forward]; a step of decodes only replays a recording when the device allows: Note [Decode
// graphs]), (5) samples one token per sequence (Note [Seeded sampling]) and delivers it. Running out
// of pages therefore means waiting, never failing; a request that could not fit even an empty cache
// is refused at submit. A full queue is a distinct refusal (Admission::kQueueFull, HTTP 429).
// Callbacks run on the scheduler thread, one request's in order, never after cancel() returns.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tandem/data/tokenizer.h"
#include "tandem/serve/decode_graphs.h"
#include "tandem/serve/decoder.h"
#include "tandem/serve/kv_cache.h"
#include "tandem/serve/sampler.h"

namespace tandem {

/// Why a request ended.
enum class GenerationEnd {
  kEos,          ///< the model produced an end-of-sequence token (not delivered as text)
  kStopString,   ///< a stop string completed (Note [Streaming text]; the stop string not delivered)
  kMaxTokens,    ///< max_tokens tokens were generated
  kContextFull,  ///< the sequence reached the model's context (or the cache's capacity)
  kCancelled,    ///< cancel(), or the scheduler stopped
  kFailed,       ///< the step failed (GenerationEvent::error says why)
};

/// "eos", "stop", "length", "context", "cancelled", "failed".
const char* generation_end_name(GenerationEnd end);

/// What a request's callback receives: a new token, or the end, or both.
struct GenerationEvent {
  std::optional<TokenId> token;  ///< the new token (none on an end that brings no token)
  std::string text;              ///< text that can be shown now (the scheduler has a tokenizer); may be ""
  std::optional<GenerationEnd> end;
  int64_t prompt_tokens = 0;         ///< the request's prompt length
  int64_t generated_tokens = 0;      ///< tokens generated so far, this one included
  double time_to_first_token_s = 0;  ///< from submit to the first token (0 before it)
  std::string error;                 ///< kFailed: the cause
};

/// Receives a request's events on the scheduler thread; must not block for long.
using GenerationCallback = std::function<void(const GenerationEvent&)>;

/// One generation request.
struct GenerationRequest {
  std::vector<TokenId> prompt;  ///< at least one token
  SamplingParams sampling;
  int64_t max_tokens = 16;        ///< >= 0; fewer when the context ends first
  std::vector<std::string> stop;  ///< stop strings (need the scheduler's tokenizer)
  bool stop_at_eos = true;        ///< end at one of the scheduler's eos_ids
  GenerationCallback on_event;
};

/// How the scheduler batches.
struct SchedulerOptions {
  int64_t max_batch = 32;   ///< sequences in the running batch at most
  int64_t max_queue = 256;  ///< requests waiting for a place at most; more are refused
  /// Prompt tokens prefilled in one step at most; a longer prompt is prefilled in chunks over
  /// several steps while the running sequences decode (Note [Chunked prefill]).
  int64_t max_step_tokens = 2048;
  std::vector<TokenId> eos_ids;  ///< tokens that end a sequence (the tokenizer's EOS, config.json's)
  bool decode_graphs = true;     ///< replay decode steps from CUDA graphs where the device allows
  bool prefix_cache = true;      ///< share the pages of prompt prefixes (Note [Prefix cache])
};

/// Whether submit() took the request.
enum class Admission {
  kAccepted,
  kQueueFull,  ///< max_queue requests are waiting: try later (HTTP 429)
  kStopped,    ///< the scheduler is shutting down
};

/// submit()'s answer: the admission and, when accepted, the request's id for cancel().
struct Submission {
  Admission admission = Admission::kAccepted;
  uint64_t id = 0;
};

/// Counters for logs and Prometheus; a consistent snapshot.
struct SchedulerStats {
  int64_t queued = 0, running = 0;  ///< requests waiting, sequences in the batch
  int64_t max_queue = 0, max_batch = 0;
  int64_t pages_total = 0, pages_used = 0;
  int64_t submitted = 0, refused = 0;  ///< accepted requests; refused for a full queue
  int64_t finished = 0, cancelled = 0, failed = 0, preempted = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;  ///< prefilled (recomputation included), sampled
  int64_t prefix_hit_tokens = 0;                    ///< prompt tokens found in the prefix cache, not prefilled
  int64_t pages_cached = 0;                         ///< pages published in the prefix cache
  int64_t steps = 0;
  int64_t replayed_steps = 0, recordings = 0;  ///< decode steps replayed from recordings, and those made
  double busy_seconds = 0;                     ///< time spent in steps: the forward and the sampling
  int64_t decode_steps = 0;                    ///< steps in which every sequence added one token
  double decode_seconds = 0;                   ///< their share of busy_seconds
  /// Note [Decode step split]: over the decode steps that recorded no CUDA graph (split_steps), the
  /// wall time, the forward's and the sampling's device time (CUDA events, on a GPU) and the host's
  /// time until the forward was enqueued.
  int64_t split_steps = 0;
  double split_seconds = 0, split_forward_device_seconds = 0, split_sample_device_seconds = 0,
         split_enqueue_seconds = 0;
  double delivery_seconds = 0;   ///< time spent handing tokens to callbacks (text, stop strings)
  double tokens_per_second = 0;  ///< generated tokens / busy seconds
  double mean_time_to_first_token_s = 0, last_time_to_first_token_s = 0;
};

/// The scheduler (Note [Continuous batching]).
class BatchScheduler {
 public:
  /// Starts the scheduler thread and returns once it has run one warm-up step (the first request's
  /// time to first token then excludes the device's lazy start). `decoder`, `cache` and `tokenizer`
  /// (null: no text, no stop strings) must outlive the scheduler; nothing else may use the decoder
  /// or cache meanwhile.
  BatchScheduler(Decoder& decoder, KvCache& cache, const Tokenizer* tokenizer, SchedulerOptions options);
  /// stop().
  ~BatchScheduler();
  BatchScheduler(const BatchScheduler&) = delete;
  BatchScheduler& operator=(const BatchScheduler&) = delete;

  /// Queues a request. UserError (nothing queued, no callback) when it is malformed: empty prompt,
  /// a token outside the vocabulary, a prompt that fills the context (context_tokens()), negative
  /// max_tokens, sampling parameters out of range, stop strings without a tokenizer.
  Submission submit(GenerationRequest request);
  /// Ends request `id`: its pages are freed at the next step and no callback runs after this returns
  /// (also when called from the request's own callback). Unknown or finished ids are ignored.
  void cancel(uint64_t id);
  /// The counters now (any thread).
  SchedulerStats stats() const;
  /// Blocks until no request is waiting or running.
  void wait_idle();
  /// Refuses new requests, ends the outstanding ones with kCancelled (their callbacks get that end)
  /// and joins the thread. Idempotent.
  void stop();

  /// Tokens a sequence may hold: the model's context, or the cache's whole capacity if smaller.
  int64_t context_tokens() const { return context_tokens_; }

 private:
  struct Request;
  using RequestPtr = std::shared_ptr<Request>;

  void loop();
  void step(std::vector<RequestPtr>& running);
  void drop_cancelled(std::vector<RequestPtr>& running);
  void grow_running(std::vector<RequestPtr>& running);
  void admit(std::vector<RequestPtr>& running);
  void run_step(std::vector<RequestPtr>& running);
  void deliver(Request& r, TokenId token);
  void finish(Request& r, GenerationEnd end, const std::string& error = "", GenerationEvent* last = nullptr);
  void emit(Request& r, const GenerationEvent& event);
  void preempt(RequestPtr r);
  int64_t share_prefix(Request& r);

  Decoder& decoder_;
  KvCache& cache_;
  const Tokenizer* tokenizer_;
  SchedulerOptions options_;
  int64_t context_tokens_ = 0;
  std::unique_ptr<DecodeGraphs> graphs_;  // null: every step runs eagerly (scheduler thread only)
  struct StepEvents;
  std::unique_ptr<StepEvents> step_events_;  // on a GPU, the decode step's events (scheduler thread only)
  bool prefix_cache_ = false;                // options_.prefix_cache where positions allow it

  mutable std::mutex mutex_;  // guards the fields below
  std::condition_variable wake_, idle_;
  std::deque<RequestPtr> waiting_;
  std::map<uint64_t, RequestPtr> live_;  // waiting or running, by id
  uint64_t next_id_ = 0;
  bool stopping_ = false;
  SchedulerStats counters_;
  double ttft_sum_s_ = 0;
  int64_t ttft_count_ = 0;

  std::mutex join_mutex_;      // one stop() joins
  std::thread::id thread_id_;  // the scheduler thread's, set before the constructor returns
  std::thread thread_;
};

}  // namespace tandem
