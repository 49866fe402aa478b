#pragma once
// A model loaded for generation, as `tandem generate` and `tandem serve` take it from the command
// line: the folder's weights on the chosen device under a memory plan (Note [Generation memory]),
// its tokenizer, the decoder and the paged KV cache.

#include <c10/core/Device.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "tandem/data/tokenizer.h"
#include "tandem/serve/decoder.h"
#include "tandem/serve/kv_cache.h"
#include "tandem/serve/model_folder.h"

namespace tandem {

/// How to load (the flags of `tandem generate` and `tandem serve`).
struct GenerationModelOptions {
  std::string checkpoint;        ///< tandem checkpoint, run directory or HF model folder
  std::string tokenizer;         ///< "" = found beside the weights
  std::string device = "auto";   ///< auto | cpu | cuda | cuda:N (auto, cuda: the GPU with the most free memory)
  std::string dtype = "auto";    ///< auto (bf16 on a GPU, fp32 on the CPU) | fp32 | bf16 | fp16
  double gpu_memory_gib = 0;     ///< device memory for weights and KV cache; 0 = memory_fraction of the free memory
  double memory_fraction = 0.9;  ///< share of the device's free memory used when gpu_memory_gib is 0
  double kv_cache_gib = 0;       ///< 0 = from the budget (Note [Generation memory])
  int64_t page_tokens = 16;      ///< tokens per KV page
  int64_t prefetch_layers = 2;   ///< streamed layers uploaded ahead of the one computing
  /// Sequences decoded together at most; 0 = from memory (Note [Generation memory]). A number also
  /// sizes the automatic KV cache: that many full-context sequences, within the budget.
  int64_t max_batch = 0;
  bool decode_graphs = true;     ///< replay decode steps from CUDA graphs (Note [Decode graphs]); --eager: no
};

/// Everything generation needs, loaded.
struct GenerationModel {
  ModelFolder folder;
  c10::Device device{c10::kCPU};
  std::string device_choice;  ///< why this device ("the GPU with the most free memory, 70.1 GiB")
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Decoder> decoder;
  std::unique_ptr<KvCache> cache;
  std::vector<TokenId> eos_ids;  ///< the tokenizer's EOS and config.json's eos_token_id
  int64_t max_batch = 0;         ///< the running batch's cap: --max-batch, or from memory (Note [Generation memory])
  std::string max_batch_source;  ///< "--max-batch", or how memory sized it
  double load_seconds = 0;

  /// A few lines: model, device and dtype, weight residency, KV cache, tokenizer.
  std::string description() const;
};

/// Loads per `options`; UserError for a missing checkpoint or tokenizer, a bad flag, or a budget that
/// cannot hold the model.
GenerationModel load_generation_model(const GenerationModelOptions& options);

/// The device a flag names: auto (the GPU with the most free memory, else the CPU), cpu, cuda (the
/// GPU with the most free memory), cuda:N. `why` receives the reason. UserError for anything else.
c10::Device choose_generation_device(const std::string& flag, std::string* why);

/// The compute dtype a flag names on `device`; UserError for anything else.
torch::ScalarType generation_dtype(const std::string& flag, const c10::Device& device);

}  // namespace tandem
