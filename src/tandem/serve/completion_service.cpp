#include "tandem/serve/completion_service.h"

#include <filesystem>
#include <random>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"
#include "tandem/data/tokenizer_files.h"
#include "tandem/monitor/prometheus.h"
#include "tandem/serve/batch_scheduler.h"
#include "tandem/serve/chat_format.h"

namespace tandem {

struct CompletionService::Impl {
  GenerationModel model;
  std::string name;
  ChatFormat chat = ChatFormat::kPlain;
  std::unique_ptr<BatchScheduler> scheduler;
};

namespace {

std::string model_name_of(const CompletionServiceOptions& o, const std::string& dir) {
  if (!o.model_name.empty()) return o.model_name;
  auto p = std::filesystem::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  // A checkpoint's own folder is step_N: name the run instead.
  if (p.filename().string().rfind("step_", 0) == 0 && p.parent_path().filename() == "checkpoints")
    return p.parent_path().parent_path().filename().string();
  return p.filename().string();
}

// The prompt's ids: a completion's text as the tokenizer's template says (BOS where it adds one), a
// chat rendered in the folder's layout with the BOS written out where the layout starts with it.
std::vector<TokenId> prompt_ids(const CompletionRequest& r, const Tokenizer& tok, ChatFormat chat) {
  if (r.endpoint == ApiEndpoint::kCompletions) return tok.encode(r.prompt, SpecialTokens::kInclude);
  const std::string bos = chat == ChatFormat::kLlama3 && tok.bos_id() ? tok.id_to_token(*tok.bos_id()) : "";
  return tok.encode(render_chat(chat, r.messages, bos), SpecialTokens::kOmit);
}

SamplingParams sampling_of(const CompletionRequest& r) {
  SamplingParams s;
  s.temperature = r.temperature;
  s.top_k = r.top_k;
  s.top_p = r.top_p;
  s.repetition_penalty = r.repetition_penalty;
  s.seed = r.seed ? *r.seed : std::random_device{}();
  return s;
}

// Delivers the scheduler's events to the HTTP server's sink.
GenerationCallback to_sink(CompletionBackend::Sink sink) {
  return [sink = std::move(sink)](const GenerationEvent& e) {
    if (!e.text.empty()) sink.on_text(e.text);
    if (!e.end) return;
    const Usage usage{e.prompt_tokens, e.generated_tokens};
    switch (*e.end) {
      case GenerationEnd::kEos:
      case GenerationEnd::kStopString:
        sink.on_finish(FinishReason::kStop, usage);
        break;
      case GenerationEnd::kMaxTokens:
      case GenerationEnd::kContextFull:
        sink.on_finish(FinishReason::kLength, usage);
        break;
      case GenerationEnd::kCancelled:
        sink.on_error("the server is stopping");
        break;
      case GenerationEnd::kFailed:
        sink.on_error(e.error);
        break;
    }
  };
}

}  // namespace

CompletionService::CompletionService(const CompletionServiceOptions& options) : impl_(std::make_unique<Impl>()) {
  auto& im = *impl_;
  im.model = load_generation_model(options.model);
  im.name = model_name_of(options, im.model.folder.dir);
  const auto source = find_tokenizer(options.model.tokenizer.empty() ? im.model.folder.dir : options.model.tokenizer);
  im.chat = chat_format_of_template(source.config.chat_template);
  SchedulerOptions so;
  so.max_batch = im.model.max_batch;  // --max-batch, or from memory
  so.max_queue = options.max_queue;
  so.max_step_tokens = options.max_step_tokens;
  so.prefix_cache = options.prefix_cache;
  so.eos_ids = im.model.eos_ids;
  so.decode_graphs = options.model.decode_graphs;
  im.scheduler = std::make_unique<BatchScheduler>(*im.model.decoder, *im.model.cache, im.model.tokenizer.get(), so);
}

CompletionService::~CompletionService() {
  if (impl_->scheduler) impl_->scheduler->stop();
}

uint64_t CompletionService::submit(const CompletionRequest& r, Sink sink) {
  auto& im = *impl_;
  GenerationRequest g;
  g.prompt = prompt_ids(r, *im.model.tokenizer, im.chat);
  const int64_t context = im.scheduler->context_tokens(), n = static_cast<int64_t>(g.prompt.size());
  if (n == 0) throw ApiError(400, "invalid_request_error", "the prompt is empty", "prompt");
  if (n >= context)
    throw ApiError(400, "invalid_request_error",
                   strprintf("the prompt is %lld tokens and the model's context is %lld: shorten it", (long long)n,
                             (long long)context),
                   r.endpoint == ApiEndpoint::kCompletions ? "prompt" : "messages", "context_length_exceeded");
  g.sampling = sampling_of(r);
  const int64_t room = context - n;
  g.max_tokens = std::min(room, r.max_tokens.value_or(r.endpoint == ApiEndpoint::kCompletions ? 16 : room));
  g.stop = r.stop;
  g.stop_at_eos = !r.ignore_eos;
  if (r.endpoint == ApiEndpoint::kChatCompletions)
    for (auto& s : chat_stop_strings(im.chat)) g.stop.push_back(std::move(s));
  g.on_event = to_sink(std::move(sink));
  Submission sub;
  try {
    sub = im.scheduler->submit(std::move(g));
  } catch (const UserError& e) {
    throw ApiError(400, "invalid_request_error", e.what());
  }
  if (sub.admission == Admission::kQueueFull)
    throw ApiError(429, "rate_limit_error", "the queue is full: try again shortly", "", "queue_full");
  if (sub.admission == Admission::kStopped) throw ApiError(503, "server_error", "the server is stopping");
  return sub.id;
}

void CompletionService::cancel(uint64_t id) { impl_->scheduler->cancel(id); }

std::string CompletionService::model_id() const { return impl_->name; }

std::string CompletionService::metrics_text() const {
  const auto s = impl_->scheduler->stats();
  PrometheusText out;
  const auto metric = [&out](const char* name, const char* type, const char* help, double value) {
    out.metric(name, type, help, value);
  };
  metric("tandem_serve_queued_requests", "gauge", "Requests waiting for a place in the batch.", double(s.queued));
  metric("tandem_serve_running_requests", "gauge", "Sequences in the running batch.", double(s.running));
  metric("tandem_serve_kv_pages_used", "gauge", "KV cache pages held by sequences.", double(s.pages_used));
  metric("tandem_serve_kv_pages_capacity", "gauge", "KV cache pages in all.", double(s.pages_total));
  metric("tandem_serve_requests_total", "counter", "Requests accepted.", double(s.submitted));
  metric("tandem_serve_refused_requests_total", "counter", "Requests refused for a full queue.", double(s.refused));
  metric("tandem_serve_finished_requests_total", "counter", "Requests finished.", double(s.finished));
  metric("tandem_serve_cancelled_requests_total", "counter", "Requests cancelled.", double(s.cancelled));
  metric("tandem_serve_failed_requests_total", "counter", "Requests failed.", double(s.failed));
  metric("tandem_serve_preemptions_total", "counter", "Sequences preempted for pages.", double(s.preempted));
  metric("tandem_serve_prompt_tokens_total", "counter", "Prompt tokens prefilled.", double(s.prompt_tokens));
  metric("tandem_serve_generated_tokens_total", "counter", "Tokens generated.", double(s.generated_tokens));
  metric("tandem_serve_prefix_hit_tokens_total", "counter", "Prompt tokens found in the prefix cache, not prefilled.",
         double(s.prefix_hit_tokens));
  metric("tandem_serve_kv_pages_cached", "gauge", "KV cache pages holding published prompt prefixes.",
         double(s.pages_cached));
  metric("tandem_serve_steps_total", "counter", "Steps run.", double(s.steps));
  metric("tandem_serve_replayed_steps_total", "counter", "Decode steps replayed from CUDA graphs.",
         double(s.replayed_steps));
  metric("tandem_serve_busy_seconds_total", "counter", "Seconds spent in steps.", s.busy_seconds);
  metric("tandem_serve_decode_steps_total", "counter", "Steps in which every sequence added one token.",
         double(s.decode_steps));
  metric("tandem_serve_decode_seconds_total", "counter", "Seconds spent in decode-only steps.", s.decode_seconds);
  // Note [Decode step split]
  metric("tandem_serve_split_steps_total", "counter", "Decode steps that recorded no CUDA graph.",
         double(s.split_steps));
  metric("tandem_serve_split_forward_device_seconds_total", "counter",
         "Device time of those steps' forward (CUDA events).", s.split_forward_device_seconds);
  metric("tandem_serve_split_sample_device_seconds_total", "counter",
         "Device time of those steps' sampling (CUDA events).", s.split_sample_device_seconds);
  metric("tandem_serve_time_to_first_token_seconds", "gauge", "Mean time to first token.",
         s.mean_time_to_first_token_s);
  return out.str();
}

int64_t CompletionService::max_batch() const { return impl_->model.max_batch; }

std::string CompletionService::description() const {
  const auto& im = *impl_;
  return im.name + " (" + chat_format_name(im.chat) + " chat) " + im.model.description();
}

}  // namespace tandem
