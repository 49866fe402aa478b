// A model loaded for generation on the CPU (serve/generation_model.h): the --device and --dtype flags,
// option checks before any file is read, Note [Generation memory]'s split of a budget between KV
// cache and weights, config.json's EOS ids, and every tensor of the folder used.

#include "tandem/serve/generation_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "../error_of.h"
#include "../test_util.h"
#include "serve_test_util.h"
#include "tandem/formats/safetensors.h"
#include "tandem/io/hf_config.h"
#include "tandem/serve/residency_plan.h"

namespace tandem {
namespace {

using test::error_of;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// 4 layers over the byte vocabulary (the byte tokenizer's 256 ids).
ModelSpec folder_spec() { return test::small_llama_spec(256); }

// A model folder as save_pretrained lays it out: config.json and model.safetensors; `extra` tensors
// are written beside the model's.
void write_folder(const std::string& dir, const ModelSpec& spec,
                  const std::vector<std::pair<std::string, torch::Tensor>>& extra = {}) {
  auto model = test::random_llama(spec, 5);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (auto& [name, t] : model->hf_state_dict()) tensors.emplace_back(name, t);
  tensors.insert(tensors.end(), extra.begin(), extra.end());
  write_safetensors(dir + "/model.safetensors", tensors);
  std::ofstream(dir + "/config.json") << hf_config_json(spec);
}

GenerationModelOptions cpu_options(const std::string& dir) {
  GenerationModelOptions o;
  o.checkpoint = dir;
  o.tokenizer = "byte";
  o.device = "cpu";
  return o;
}

// Bytes of one KV cache token of `spec` in fp32: keys and values of every layer.
int64_t kv_token_bytes(const ModelSpec& spec) { return spec.n_layer * 2 * spec.n_kv_head * spec.head_dim() * 4; }

TEST(ServeGenerationModel, TheDtypeFlagNamesATypeAndAutoDependsOnTheDevice) {
  const c10::Device cpu(c10::kCPU), gpu(c10::kCUDA, 0);
  EXPECT_EQ(generation_dtype("auto", cpu), torch::kFloat32);
  EXPECT_EQ(generation_dtype("auto", gpu), torch::kBFloat16);
  for (const char* f : {"fp32", "float32"}) EXPECT_EQ(generation_dtype(f, gpu), torch::kFloat32) << f;
  for (const char* f : {"bf16", "bfloat16"}) EXPECT_EQ(generation_dtype(f, cpu), torch::kBFloat16) << f;
  for (const char* f : {"fp16", "float16"}) EXPECT_EQ(generation_dtype(f, cpu), torch::kFloat16) << f;
  for (const char* f : {"int8", "FP32", "", "half"})
    EXPECT_NE(error_of([&] {
                generation_dtype(f, cpu);
              }).find(std::string("--dtype must be auto, fp32, bf16 or fp16; got '") + f + "'"),
              std::string::npos)
        << f;
}

TEST(ServeGenerationModel, TheCpuIsTakenWhenAskedForOrWhenNoGpuIsVisible) {
  std::string why;
  EXPECT_EQ(choose_generation_device("cpu", &why), c10::Device(c10::kCPU));
  EXPECT_EQ(why, "--device cpu");
  EXPECT_EQ(choose_generation_device("cpu", nullptr), c10::Device(c10::kCPU));  // the reason is optional
  for (const char* flag : {"auto", ""}) {
    why.clear();
    const c10::Device d = choose_generation_device(flag, &why);
    if (torch::cuda::is_available()) {
      EXPECT_TRUE(d.is_cuda()) << flag;
      EXPECT_NE(why.find("GPU"), std::string::npos) << why;
    } else {
      EXPECT_TRUE(d.is_cpu()) << flag;
      EXPECT_EQ(why, "no GPU visible");
    }
  }
}

TEST(ServeGenerationModel, AGpuThatIsNotThereIsRefusedWithTheFix) {
  if (!torch::cuda::is_available()) {
    for (const char* flag : {"cuda", "cuda:0"})
      EXPECT_NE(error_of([&] {
                  choose_generation_device(flag, nullptr);
                }).find(std::string("--device ") + flag + " but no CUDA device is visible"),
                std::string::npos)
          << flag;
  } else {
    const std::string message = error_of([] { choose_generation_device("cuda:999", nullptr); });
    EXPECT_NE(message.find("--device cuda:999 but "), std::string::npos) << message;
    EXPECT_NE(message.find("CUDA device(s) are visible"), std::string::npos) << message;
    std::string why;
    EXPECT_EQ(choose_generation_device("cuda:0", &why), c10::Device(c10::kCUDA, 0));
    EXPECT_EQ(why, "--device cuda:0");
  }
  for (const char* flag : {"tpu", "gpu", "cuda:x", "cuda:-1", "cuda:12345", "CPU"})
    EXPECT_NE(error_of([&] {
                choose_generation_device(flag, nullptr);
              }).find(std::string("--device '") + flag + "' is not a device"),
              std::string::npos)
        << flag;
}

// The flags are checked before the checkpoint is looked at: each message is the flag's, not the
// missing folder's.
TEST(ServeGenerationModel, BadOptionsAreRefusedBeforeAnyFileIsRead) {
  test::TempDir dir;
  const auto refusal = [&](auto change) {
    GenerationModelOptions o = cpu_options(dir.file("no-such-checkpoint"));
    change(o);
    return error_of([&] { load_generation_model(o); });
  };
  EXPECT_NE(refusal([](auto& o) { o.page_tokens = 0; }).find("--page-tokens must be at least 1; got 0"),
            std::string::npos);
  EXPECT_NE(refusal([](auto& o) { o.max_batch = -1; }).find("--max-batch must be at least 1 (or 0: from memory); got -1"),
            std::string::npos);
  EXPECT_NE(refusal([](auto& o) { o.memory_fraction = 0; }).find("--memory-fraction must be in (0, 1]"),
            std::string::npos);
  EXPECT_NE(refusal([](auto& o) { o.memory_fraction = 1.5; }).find("--memory-fraction must be in (0, 1]; got 1.5"),
            std::string::npos);
  EXPECT_NE(refusal([](auto& o) { o.gpu_memory_gib = -1; }).find("--gpu-memory-gib and --kv-cache-gib must be >= 0"),
            std::string::npos);
  EXPECT_NE(refusal([](auto& o) { o.kv_cache_gib = -0.5; }).find("--gpu-memory-gib and --kv-cache-gib must be >= 0"),
            std::string::npos);
  // With good flags, the folder is what is refused.
  EXPECT_NE(refusal([](auto&) {}).find("no-such-checkpoint"), std::string::npos);
  // The tokenizer is opened before the weights are read: a missing one is named.
  write_folder(dir.path(), folder_spec());
  GenerationModelOptions o = cpu_options(dir.path());
  o.tokenizer = dir.file("no-tokenizer.json");
  EXPECT_NE(error_of([&] { load_generation_model(o); }).find("no-tokenizer.json"), std::string::npos);
}

TEST(ServeGenerationModel, OnTheCpuEveryLayerIsResidentAndTheCacheHoldsMaxBatchContexts) {
  test::TempDir dir;
  const ModelSpec spec = folder_spec();
  write_folder(dir.path(), spec);
  GenerationModelOptions o = cpu_options(dir.path());
  o.max_batch = 3;
  const GenerationModel g = load_generation_model(o);
  EXPECT_TRUE(g.device.is_cpu());
  EXPECT_EQ(g.device_choice, "--device cpu");
  EXPECT_EQ(g.decoder->weights().placement().dtype, torch::kFloat32);
  EXPECT_EQ(g.decoder->weights().placement().plan.streamed(), 0);
  // What max_batch full contexts need, in whole pages (far below a quarter of the host's memory).
  const int64_t page_bytes = kv_token_bytes(spec) * o.page_tokens;
  EXPECT_EQ(g.cache->pages_total(), 3 * spec.max_seq_len * kv_token_bytes(spec) / page_bytes);
  EXPECT_EQ(g.cache->page_tokens(), 16);
  EXPECT_TRUE(g.eos_ids.empty());  // the byte tokenizer has no EOS and config.json names none
  EXPECT_GT(g.load_seconds, 0.0);
  const std::string d = g.description();
  for (const std::string& want :
       {"model " + dir.path() + ": llama, 4 layers, d_model 32, 4 heads (2 key/value), context 96",
        std::string("device cpu (--device cpu), fp32; weights: all 4 layers resident"),
        std::string("KV cache: ") + std::to_string(g.cache->pages_total()) + " pages of 16 tokens",
        std::string("batch up to 3 sequences (--max-batch)"),
        std::string("tokenizer: byte tokenizer")})
    EXPECT_NE(d.find(want), std::string::npos) << want << "\n" << d;
  EXPECT_EQ(std::count(d.begin(), d.end(), '\n'), 3) << d;
}

TEST(ServeGenerationModel, AGivenCacheSizeAndDtypeAreTakenAsGiven) {
  test::TempDir dir;
  const ModelSpec spec = folder_spec();
  write_folder(dir.path(), spec);
  GenerationModelOptions o = cpu_options(dir.path());
  o.dtype = "bf16";
  o.page_tokens = 8;
  const int64_t page_bytes = spec.n_layer * 2 * spec.n_kv_head * spec.head_dim() * 2 * 8;  // bf16
  o.kv_cache_gib = double(10 * page_bytes + page_bytes / 2) / kGiB;                        // 10.5 pages
  const GenerationModel g = load_generation_model(o);
  EXPECT_EQ(g.decoder->weights().placement().dtype, torch::kBFloat16);
  EXPECT_EQ(g.cache->pages_total(), 10);
  EXPECT_EQ(g.cache->tokens_total(), 80);
  EXPECT_NE(g.description().find("bf16"), std::string::npos) << g.description();
}

// Note [Generation memory] with a device budget (--gpu-memory-gib, which exercises the streaming
// path on the CPU): the cache's share comes off first, the weights take the rest.
TEST(ServeGenerationModel, ADeviceBudgetStreamsTheLayersBeyondIt) {
  test::TempDir dir;
  const ModelSpec spec = folder_spec();
  write_folder(dir.path(), spec);
  const int64_t layer = decoder_layer_numel(spec) * 4, fixed = decoder_fixed_numel(spec) * 4;
  const int64_t page_bytes = kv_token_bytes(spec) * 16;
  GenerationModelOptions o = cpu_options(dir.path());
  o.prefetch_layers = 1;  // two streaming buffers
  o.kv_cache_gib = double(4 * page_bytes) / kGiB;
  // The weights' share holds the fixed weights, the two buffers and one resident layer.
  o.gpu_memory_gib = double(4 * page_bytes + fixed + 3 * layer + layer / 2) / kGiB;
  const GenerationModel g = load_generation_model(o);
  const ResidencyPlan& plan = g.decoder->weights().placement().plan;
  EXPECT_EQ(plan.resident(), 1);
  EXPECT_EQ(plan.streamed(), 3);
  EXPECT_EQ(plan.slots, 2);
  EXPECT_EQ(g.cache->pages_total(), 4);
  EXPECT_NE(g.description().find("1 of 4 layers resident, 3 streamed from pinned host memory"), std::string::npos)
      << g.description();

  // Without --kv-cache-gib the cache wants max_batch full contexts; a quarter of the budget is set
  // aside for it, and afterwards it takes what the weights left, up to what it wants.
  const int64_t all_weights = fixed + spec.n_layer * layer;
  ASSERT_LE(spec.max_seq_len * kv_token_bytes(spec), all_weights);  // so at most half is set aside
  GenerationModelOptions wide = cpu_options(dir.path());
  wide.max_batch = 1000;                                 // wants far more than the budget
  wide.gpu_memory_gib = double(2 * all_weights) / kGiB;  // all layers fit beside the cache's share
  const GenerationModel w = load_generation_model(wide);
  EXPECT_EQ(w.decoder->weights().placement().plan.streamed(), 0);
  EXPECT_EQ(w.cache->pages_total(), all_weights / page_bytes);
  wide.max_batch = 1;  // wants one context: gets just that
  EXPECT_EQ(load_generation_model(wide).cache->pages_total(), spec.max_seq_len * kv_token_bytes(spec) / page_bytes);
}

// Note [Generation memory] by default: the cache takes all the budget the weights leave, and the
// running batch is what it holds at 512 tokens a sequence (the context, if shorter), at most 256.
// On the CPU without a device budget the batch is 32 and the cache what 32 full contexts need.
TEST(ServeGenerationModel, ByDefaultTheCacheTakesWhatTheWeightsLeaveAndSizesTheBatch) {
  test::TempDir dir;
  const ModelSpec spec = folder_spec();
  write_folder(dir.path(), spec);
  const int64_t layer = decoder_layer_numel(spec) * 4, fixed = decoder_fixed_numel(spec) * 4;
  const int64_t all_weights = fixed + spec.n_layer * layer, page_bytes = kv_token_bytes(spec) * 16;
  GenerationModelOptions o = cpu_options(dir.path());
  const GenerationModel cpu = load_generation_model(o);
  EXPECT_EQ(cpu.max_batch, 32);
  EXPECT_EQ(cpu.cache->pages_total(), 32 * spec.max_seq_len * kv_token_bytes(spec) / page_bytes);
  EXPECT_NE(cpu.description().find("batch up to 32 sequences (the CPU's default)"), std::string::npos)
      << cpu.description();

  // A budget of the weights and 40 pages: the weights all resident, the cache the 40 pages, and
  // 40 x 16 tokens hold 6 sequences of the 96-token context.
  o.gpu_memory_gib = double(all_weights + 40 * page_bytes + page_bytes / 2) / kGiB;
  const GenerationModel g = load_generation_model(o);
  EXPECT_EQ(g.decoder->weights().placement().plan.streamed(), 0);
  EXPECT_EQ(g.cache->pages_total(), 40);
  ASSERT_LT(spec.max_seq_len, 512);
  EXPECT_EQ(g.max_batch, 40 * 16 / spec.max_seq_len);
  EXPECT_NE(g.description().find("batch up to 6 sequences (from memory: the cache holds 96 tokens a sequence)"),
            std::string::npos)
      << g.description();

  // A budget too small for every layer beside a quarter for the cache: layers stream, the cache
  // keeps what they leave, and the batch is at least one sequence.
  o.gpu_memory_gib = double(all_weights) / kGiB;
  o.prefetch_layers = 1;  // two streaming buffers
  const GenerationModel small = load_generation_model(o);
  EXPECT_GT(small.decoder->weights().placement().plan.streamed(), 0);
  EXPECT_GE(small.cache->bytes(), static_cast<int64_t>(o.gpu_memory_gib * kGiB) / 4 - page_bytes);
  EXPECT_GE(small.max_batch, 1);

  // A large budget: the batch stops at 256 however many tokens the cache holds.
  o.gpu_memory_gib = double(all_weights + 300 * spec.max_seq_len * kv_token_bytes(spec)) / kGiB;
  EXPECT_EQ(load_generation_model(o).max_batch, 256);

  // --max-batch N keeps its meaning: N full contexts wanted, and N the batch.
  o.max_batch = 2;
  const GenerationModel two = load_generation_model(o);
  EXPECT_EQ(two.max_batch, 2);
  EXPECT_EQ(two.cache->pages_total(), 2 * spec.max_seq_len * kv_token_bytes(spec) / page_bytes);
}

TEST(ServeGenerationModel, ABudgetTheCacheFillsIsRefusedWithTheFlagsToChange) {
  test::TempDir dir;
  write_folder(dir.path(), folder_spec());
  GenerationModelOptions o = cpu_options(dir.path());
  o.gpu_memory_gib = 1000.0 / kGiB;  // less than one full context of KV cache
  const std::string message = error_of([&] { load_generation_model(o); });
  EXPECT_NE(message.find("leaves nothing for the weights after the KV cache's"), std::string::npos) << message;
  EXPECT_NE(message.find("lower --kv-cache-gib or raise --gpu-memory-gib"), std::string::npos) << message;
  o.gpu_memory_gib = 0.001;
  o.kv_cache_gib = 0.001;  // a given cache size is set aside whole
  EXPECT_NE(error_of([&] { load_generation_model(o); }).find("leaves nothing for the weights"), std::string::npos);
}

TEST(ServeGenerationModel, EosIdsAreConfigsAndTheTokenizersSortedOnce) {
  test::TempDir dir;
  ModelSpec spec = folder_spec();
  spec.token_ids = R"({"eos_token_id": [9, 3, 9], "bos_token_id": 1})";
  write_folder(dir.path(), spec);
  EXPECT_EQ(load_generation_model(cpu_options(dir.path())).eos_ids, (std::vector<TokenId>{3, 9}));
}

// Note [Every tensor used]: a tensor the decoder never reads means another architecture; a tied
// model's lm_head.weight (which transformers may write) is the embedding and counts as read.
TEST(ServeGenerationModel, AFolderWithATensorTheDecoderDoesNotReadIsRefused) {
  test::TempDir extra, tied;
  write_folder(extra.path(), folder_spec(), {{"model.layers.0.self_attn.q_proj.bias", torch::zeros({32})}});
  const std::string message = error_of([&] { load_generation_model(cpu_options(extra.path())); });
  EXPECT_NE(message.find("holds 1 tensor(s) the model does not use (model.layers.0.self_attn.q_proj.bias)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(extra.file("model.safetensors")), std::string::npos) << message;
  ModelSpec spec = folder_spec();
  spec.tie_embeddings = true;
  write_folder(tied.path(), spec, {{"lm_head.weight", torch::zeros({256, 32})}});
  EXPECT_EQ(error_of([&] { load_generation_model(cpu_options(tied.path())); }), "");
}

}  // namespace
}  // namespace tandem
