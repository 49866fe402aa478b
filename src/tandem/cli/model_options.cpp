#include "tandem/cli/model_options.h"

#include <CLI/CLI.hpp>

namespace tandem {

void add_model_options(CLI::App* c, GenerationModelOptions& model) {
  c->add_option("--checkpoint", model.checkpoint,
                "a tandem checkpoint (or run) directory, or an HF model folder (Llama, Qwen2, Mistral, Gemma, Gemma2, "
                "Phi-3, GPT-2)")
      ->required();
  c->add_option("--tokenizer", model.tokenizer,
                "tokenizer.json, tokenizer.model, a folder or 'byte' (default: beside the weights)");
  c->add_option("--device", model.device, "auto | cpu | cuda | cuda:N (auto: the GPU with the most free memory)");
  c->add_option("--dtype", model.dtype, "auto (bf16 on a GPU, fp32 on the CPU) | fp32 | bf16 | fp16");
  c->add_option("--gpu-memory-gib", model.gpu_memory_gib,
                "device memory for weights and KV cache; layers beyond it stream from pinned host memory "
                "(default: 90% of the free memory)");
  c->add_flag_callback(
      "--eager", [&model] { model.decode_graphs = false; },
      "launch every decode step kernel by kernel (default on a GPU: replay recorded steps, CUDA graphs)");
}

void add_sampling_options(CLI::App* c, SamplingParams& sampling, const std::string& each) {
  c->add_option("--temperature", sampling.temperature, "0 = greedy (the default); higher = more random");
  c->add_option("--top-k", sampling.top_k, "sample among the k most likely tokens (0 = all)");
  c->add_option("--top-p", sampling.top_p, "sample among the most likely tokens holding this much mass (1 = all)");
  c->add_option("--repetition-penalty", sampling.repetition_penalty, "penalise tokens already seen (1 = none)");
  c->add_option("--seed", sampling.seed, "random seed of the sampling (" + each + " i uses seed + i)");
}

}  // namespace tandem
