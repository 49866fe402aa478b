#pragma once
// The command-line options that `tandem generate`, `tandem serve` and `tandem chat` share: which
// model to load and where, and how to sample from it.

#include <string>

#include "tandem/serve/generation_model.h"
#include "tandem/serve/sampler.h"

namespace CLI {
class App;
}

namespace tandem {

/// --checkpoint (required), --tokenizer, --device, --dtype, --gpu-memory-gib and --eager into `model`.
void add_model_options(CLI::App* command, GenerationModelOptions& model);

/// --temperature, --top-k, --top-p, --repetition-penalty and --seed into `sampling`; `each`
/// names what the seed is counted over ("prompt", "reply").
void add_sampling_options(CLI::App* command, SamplingParams& sampling, const std::string& each);

}  // namespace tandem
