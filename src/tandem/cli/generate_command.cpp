#include "tandem/cli/generate_command.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>

#include "tandem/cli/model_options.h"
#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/strings.h"
#include "tandem/serve/batch_scheduler.h"

namespace tandem {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kGenerateBatch = 256;  // prompts decoded together by default, at most

// Completions as they arrive: one prompt streams to stdout piece by piece; a batch prints each
// completion whole, in prompt order, as soon as it and every earlier one are done.
class CompletionPrinter {
 public:
  CompletionPrinter(std::vector<std::string> prompts) : prompts_(std::move(prompts)) {
    text_.resize(prompts_.size());
    end_.resize(prompts_.size());
  }

  void on_event(size_t i, const GenerationEvent& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (prompts_.size() == 1) {
      std::fputs(e.text.c_str(), stdout);
      std::fflush(stdout);
    } else {
      text_[i] += e.text;
    }
    if (!e.end) return;
    end_[i] = e.end;
    if (*e.end == GenerationEnd::kFailed) error_ = e.error;
    if (prompts_.size() == 1) std::fputc('\n', stdout);
    while (printed_ < prompts_.size() && end_[printed_] && prompts_.size() > 1) {
      std::printf("[%zu] %s\n%s\n\n", printed_ + 1, prompts_[printed_].c_str(), text_[printed_].c_str());
      ++printed_;
    }
    std::fflush(stdout);
  }

  /// The end of prompt i (set once it ended).
  std::optional<GenerationEnd> end(size_t i) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return end_[i];
  }
  std::string error() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> prompts_, text_;
  std::vector<std::optional<GenerationEnd>> end_;
  size_t printed_ = 0;
  std::string error_;
};

std::string peak_memory(const c10::Device& device) {
  std::string out;
  if (device.is_cuda() && accelerator() != nullptr)
    out = format_bytes(double(accelerator()->memory_stats(device.index()).peak_allocated)) + " GPU, ";
  return out + format_bytes(double(host_peak_rss_bytes())) + " host (peak RSS)";
}

}  // namespace

GenerateCommand::GenerateCommand(CLI::App& app) {
  sampling_.temperature = 0;  // greedy unless asked
  command_ = app.add_subcommand(
      "generate",
      "generate text from a checkpoint or an HF model folder (Llama, Qwen2, Mistral, Gemma, Gemma2, Phi-3, GPT-2)");
  auto* c = command_;
  add_model_options(c, model_);
  c->add_option("--prompt", prompt_, "the prompt");
  c->add_option("--prompts", prompts_file_, "a file of prompts, one per line, generated together as one batch");
  c->add_option("--max-tokens", max_tokens_, "tokens to generate at most (default 128)");
  add_sampling_options(c, sampling_, "prompt");
  c->add_option("--stop", stop_, "stop at this text, not printed (repeatable)");
  c->add_flag("--ignore-eos", ignore_eos_, "keep generating after the end-of-sequence token");
  c->add_option("--memory-fraction", model_.memory_fraction, "share of the GPU's free memory to use (default 0.9)");
  c->add_option("--kv-cache-gib", model_.kv_cache_gib, "KV cache size (default: what the batch needs, within budget)");
  c->add_option("--page-tokens", model_.page_tokens, "tokens per KV cache page (default 16)");
  c->add_option("--prefetch-layers", model_.prefetch_layers,
                "streamed layers uploaded ahead of the one computing (default 2)");
  c->add_option("--max-batch", model_.max_batch,
                "sequences decoded together at most (default: every prompt, at most 256)")
      ->check(CLI::Range(1, 4096));
}

bool GenerateCommand::chosen() const { return command_->parsed(); }

std::vector<std::string> GenerateCommand::prompts() const {
  TANDEM_CHECK(prompt_.empty() != prompts_file_.empty(), "give --prompt TEXT or --prompts FILE (one of them)");
  if (!prompt_.empty()) return {prompt_};
  std::ifstream in(prompts_file_);
  TANDEM_CHECK(in.good(), "--prompts: cannot open '", prompts_file_, "'; give a text file with one prompt per line");
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) out.push_back(line);
  }
  TANDEM_CHECK(!out.empty(), "--prompts: '", prompts_file_, "' holds no prompt; write one prompt per line");
  return out;
}

int GenerateCommand::run() {
  const auto texts = prompts();
  TANDEM_CHECK(max_tokens_ >= 0, "--max-tokens must be >= 0; got ", max_tokens_);
  check_sampling_params(sampling_);
  // One batch of the prompts: the cache sized for that many full contexts (Note [Generation memory]).
  const bool given = model_.max_batch > 0;
  model_.max_batch = std::min<int64_t>(given ? model_.max_batch : kGenerateBatch, static_cast<int64_t>(texts.size()));
  GenerationModel model = load_generation_model(model_);
  if (!given) model.max_batch_source = strprintf("the prompts, at most %lld", static_cast<long long>(kGenerateBatch));

  SchedulerOptions options;
  options.max_batch = model.max_batch;
  options.max_queue = static_cast<int64_t>(texts.size());
  if (!ignore_eos_) options.eos_ids = model.eos_ids;
  options.decode_graphs = model_.decode_graphs;
  BatchScheduler scheduler(*model.decoder, *model.cache, model.tokenizer.get(), options);
  std::vector<GenerationRequest> requests;
  for (size_t i = 0; i < texts.size(); ++i) {
    GenerationRequest r;
    r.prompt = model.tokenizer->encode(texts[i], SpecialTokens::kInclude);
    const std::string which = texts.size() == 1 ? "the prompt" : strprintf("prompt %zu", i + 1);
    TANDEM_CHECK(!r.prompt.empty(), which, " encodes to no tokens; give some text");
    TANDEM_CHECK(static_cast<int64_t>(r.prompt.size()) < scheduler.context_tokens(), which, " is ", r.prompt.size(),
                 " tokens but the context holds ", scheduler.context_tokens(),
                 " (prompt and output together); shorten it");
    r.sampling = sampling_;
    r.sampling.seed = sampling_.seed + i;
    r.max_tokens = max_tokens_;
    r.stop = stop_;
    requests.push_back(std::move(r));
  }
  std::fprintf(stderr, "%sloaded in %.2f s\n", model.description().c_str(), model.load_seconds);
  CompletionPrinter printer(texts);
  const auto t0 = Clock::now();
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].on_event = [&printer, i](const GenerationEvent& e) { printer.on_event(i, e); };
    const auto s = scheduler.submit(std::move(requests[i]));
    TANDEM_ASSERT(s.admission == Admission::kAccepted, "the scheduler refused a prompt of the batch");
  }
  scheduler.wait_idle();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto st = scheduler.stats();
  scheduler.stop();

  if (st.decode_steps > 0) {
    const std::string replayed =
        st.recordings > 0 ? strprintf(", %lld replayed from %lld recordings (CUDA graphs; --eager: none)",
                                      static_cast<long long>(st.replayed_steps), static_cast<long long>(st.recordings))
                          : "";
    const double per = 1e3 / double(st.decode_steps);
    const double each = 1e3 / double(std::max<int64_t>(1, st.split_steps));
    const std::string split =  // Note [Decode step split]
        st.split_forward_device_seconds > 0
            ? strprintf(
                  "; the %lld that recorded nothing: %.2f ms, of it on the device forward %.2f ms, sampling "
                  "%.2f ms; host until enqueued %.2f ms",
                  static_cast<long long>(st.split_steps), each * st.split_seconds,
                  each * st.split_forward_device_seconds, each * st.split_sample_device_seconds,
                  each * st.split_enqueue_seconds)
            : "";
    std::fprintf(stderr, "decode: %lld steps of %.2f ms (forward and sampling)%s%s; delivery %.2f ms a step\n",
                 static_cast<long long>(st.decode_steps), per * st.decode_seconds, replayed.c_str(), split.c_str(),
                 1e3 * st.delivery_seconds / double(std::max<int64_t>(1, st.steps)));
  }
  std::string ends;
  if (texts.size() == 1 && printer.end(0)) ends = std::string(" (ended: ") + generation_end_name(*printer.end(0)) + ")";
  std::fprintf(stderr,
               "%zu prompt%s, %lld prompt tokens, %lld generated in %.2f s: %.1f tokens/s%s; time to first token "
               "%.1f ms%s; peak memory %s\n",
               texts.size(), texts.size() == 1 ? "" : "s", static_cast<long long>(st.prompt_tokens),
               static_cast<long long>(st.generated_tokens), seconds,
               seconds > 0 ? double(st.generated_tokens) / seconds : 0.0, ends.c_str(),
               st.mean_time_to_first_token_s * 1e3, texts.size() == 1 ? "" : " (mean)",
               peak_memory(model.device).c_str());
  if (!printer.error().empty()) {
    std::fprintf(stderr, "tandem: error: generation failed: %s\n", one_line(printer.error()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace tandem
