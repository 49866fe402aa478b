#pragma once
// The model behind `tandem serve`: a checkpoint or HF folder loaded for decoding, its tokenizer and
// chat format, and the continuous-batching scheduler, turned into the text-level CompletionBackend
// the HTTP server calls (prompts rendered and tokenized, pieces of text streamed out, stop strings
// cut, refusals as OpenAI errors).

#include <cstdint>
#include <memory>
#include <string>

#include "tandem/serve/generation_model.h"
#include "tandem/serve/http_server.h"

namespace tandem {

struct CompletionServiceOptions {
  GenerationModelOptions model;    ///< what to load and where (serve/generation_model.h)
  std::string model_name;          ///< "" = the folder's name
  int64_t max_queue = 256;         ///< requests waiting for a place; more are refused (429)
  bool prefix_cache = true;        ///< share prompt prefixes' KV pages (Note [Prefix cache]; --no-prefix-cache)
  int64_t max_step_tokens = 2048;  ///< prompt tokens prefilled a step; longer prompts in chunks (--max-step-tokens)
};

/// Loads the model and starts its scheduler; serves requests until destroyed.
class CompletionService : public CompletionBackend {
 public:
  /// UserError for a missing or unreadable checkpoint or tokenizer, or a plan that cannot fit.
  explicit CompletionService(const CompletionServiceOptions& options);
  ~CompletionService() override;
  CompletionService(const CompletionService&) = delete;
  CompletionService& operator=(const CompletionService&) = delete;

  uint64_t submit(const CompletionRequest& request, Sink sink) override;
  void cancel(uint64_t id) override;
  std::string model_id() const override;
  std::string metrics_text() const override;

  /// One line for the start message: model, parameters, device, tokenizer, chat format, cache.
  std::string description() const;
  /// Sequences decoded together at most (--max-batch, or from memory: Note [Generation memory]).
  int64_t max_batch() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
