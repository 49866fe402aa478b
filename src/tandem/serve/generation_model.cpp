#include "tandem/serve/generation_model.h"

#include <algorithm>
#include <chrono>

#include "tandem/core/device.h"
#include "tandem/core/device_spec.h"
#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/data/tokenizer_files.h"
#include "tandem/formats/tensor_use.h"
#include "tandem/formats/weight_files.h"
#include "tandem/models/family.h"

namespace tandem {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

int cuda_devices() {
  if (!torch::cuda::is_available() || accelerator() == nullptr) return 0;
  return accelerator()->device_count();
}

int64_t gib_bytes(double gib) { return static_cast<int64_t>(gib * kGiB); }

// Note [Generation memory]
// On a GPU the budget B is --gpu-memory-gib, or --memory-fraction of the free memory; activations of
// a step, cuBLAS's workspace and the recorded decode steps come on top and are small beside it
// (the fraction's rest holds them). By default (neither --max-batch nor --kv-cache-gib) the memory
// sizes both the cache and the running batch, as a serving engine should: the weights are planned
// against B less a quarter of it (at least one full context) set aside for the cache, so a model
// too large for B streams layers rather than starving the cache (Note [Streamed layers]); the cache
// then takes all that the weights left, and the running batch is as many sequences as the cache
// holds at kBatchTokens tokens each (the context, if shorter), at most kMaxAutoBatch. Longer
// sequences than that share the pages as they go: the scheduler admits while pages fit and
// preempts when they run out (Note [Continuous batching]). --max-batch N instead wants the cache
// of N full contexts (at most the quarter, at least one context, then what the weights left, up to
// what it wants); --kv-cache-gib sets the cache whole, the batch then from it as above. On the CPU
// the weights are all resident unless --gpu-memory-gib is given (which exercises the streaming
// path), the running batch is kCpuBatch by default (a CPU step's time grows with it), and the cache
// takes what that batch's full contexts need, up to a quarter of the available host memory.
constexpr int64_t kBatchTokens = 512;
constexpr int64_t kMaxAutoBatch = 256;
constexpr int64_t kCpuBatch = 32;

struct MemoryPlan {
  ResidencyPlan weights;
  int64_t kv_bytes = 0;
  int64_t max_batch = 0;
  std::string max_batch_source;
};

// The running batch the cache's tokens hold at kBatchTokens a sequence (Note [Generation memory]).
void size_batch(MemoryPlan& m, const GenerationModelOptions& o, const ModelSpec& spec, int64_t kv_token,
                bool device_budget) {
  if (o.max_batch > 0) {
    m.max_batch = o.max_batch, m.max_batch_source = "--max-batch";
  } else if (!device_budget) {
    m.max_batch = kCpuBatch, m.max_batch_source = "the CPU's default";
  } else {
    const int64_t per = std::min(spec.max_seq_len, kBatchTokens);
    m.max_batch = std::clamp<int64_t>(m.kv_bytes / kv_token / per, 1, kMaxAutoBatch);
    m.max_batch_source = strprintf("from memory: the cache holds %lld tokens a sequence", static_cast<long long>(per));
  }
}

MemoryPlan plan_memory(const GenerationModelOptions& o, const ModelSpec& spec, const KvCacheShape& shape,
                       const c10::Device& device, torch::ScalarType dtype) {
  const int64_t kv_token = shape.token_bytes();
  int64_t usable = -1;
  if (o.gpu_memory_gib > 0) {
    usable = gib_bytes(o.gpu_memory_gib);
  } else if (device.is_cuda()) {
    usable = static_cast<int64_t>(double(accelerator()->memory_stats(device.index()).free) * o.memory_fraction);
  }
  const bool given = o.kv_cache_gib > 0;
  MemoryPlan m;
  if (usable < 0) {
    const int64_t batch = o.max_batch > 0 ? o.max_batch : kCpuBatch;
    const int64_t want = given ? gib_bytes(o.kv_cache_gib) : batch * spec.max_seq_len * kv_token;
    m.weights = plan_residency(spec, dtype, -1, o.prefetch_layers);
    const int64_t host = host_available_bytes();
    m.kv_bytes = given || host <= 0 ? want : std::min(want, kv_cache_budget(host, 0.25, 0));
    size_batch(m, o, spec, kv_token, false);
    return m;
  }
  // What the cache wants: as given, N full contexts, or (from memory) all the budget.
  const int64_t want = given ? gib_bytes(o.kv_cache_gib)
                       : o.max_batch > 0 ? o.max_batch * spec.max_seq_len * kv_token
                                         : usable;
  const int64_t reserve = given ? want : std::min(want, std::max(usable / 4, spec.max_seq_len * kv_token));
  const int64_t budget = usable - reserve;
  TANDEM_CHECK(budget > 0, "the device budget of ", format_bytes(double(usable)), " leaves nothing for the ",
               "weights after the KV cache's ", format_bytes(double(reserve)), "; lower --kv-cache-gib or raise ",
               "--gpu-memory-gib");
  m.weights = plan_residency(spec, dtype, budget, o.prefetch_layers);
  m.kv_bytes = given ? want : std::min(want, usable - m.weights.device_bytes());
  size_batch(m, o, spec, kv_token, true);
  return m;
}

const char* dtype_name(torch::ScalarType t) {
  return t == torch::kBFloat16 ? "bf16" : t == torch::kFloat16 ? "fp16" : t == torch::kFloat32 ? "fp32" : "?";
}

std::vector<TokenId> merged_eos(const Tokenizer& tokenizer, const std::vector<TokenId>& config) {
  std::vector<TokenId> ids = config;
  if (const auto e = tokenizer.eos_id()) ids.push_back(*e);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace

c10::Device choose_generation_device(const std::string& flag, std::string* why) {
  const int n = cuda_devices();
  const auto most_free = [&] {
    int best = 0;
    int64_t best_free = -1;
    for (int i = 0; i < n; ++i) {
      const int64_t free = accelerator()->memory_stats(i).free;
      if (free > best_free) best = i, best_free = free;
    }
    if (why != nullptr)
      *why = n > 1
                 ? strprintf("the GPU with the most free memory (%s) of %d", format_bytes(double(best_free)).c_str(), n)
                 : strprintf("the only GPU (%s free)", format_bytes(double(best_free)).c_str());
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(best));
  };
  const DeviceSpec d = DeviceSpec::parse(flag, "--device");
  if (d.kind == DeviceSpec::Kind::kCpu || (d.kind == DeviceSpec::Kind::kAuto && n == 0)) {
    if (why != nullptr) *why = d.kind == DeviceSpec::Kind::kCpu ? "--device cpu" : "no GPU visible";
    return c10::Device(c10::kCPU);
  }
  TANDEM_CHECK(n > 0, "--device ", flag,
               " but no CUDA device is visible (or this build has no CUDA); use --device cpu");
  if (d.index < 0) return most_free();  // auto or cuda
  TANDEM_CHECK(d.index < n, "--device ", flag, " but ", n, " CUDA device(s) are visible");
  if (why != nullptr) *why = "--device " + flag;
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(d.index));
}

torch::ScalarType generation_dtype(const std::string& flag, const c10::Device& device) {
  if (flag == "auto") return device.is_cpu() ? torch::kFloat32 : torch::kBFloat16;
  if (flag == "fp32" || flag == "float32") return torch::kFloat32;
  if (flag == "bf16" || flag == "bfloat16") return torch::kBFloat16;
  if (flag == "fp16" || flag == "float16") return torch::kFloat16;
  TANDEM_FAIL("--dtype must be auto, fp32, bf16 or fp16; got '", flag, "'");
}

GenerationModel load_generation_model(const GenerationModelOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  TANDEM_CHECK(o.page_tokens >= 1, "--page-tokens must be at least 1; got ", o.page_tokens);
  TANDEM_CHECK(o.max_batch >= 0, "--max-batch must be at least 1 (or 0: from memory); got ", o.max_batch);
  TANDEM_CHECK(o.memory_fraction > 0 && o.memory_fraction <= 1, "--memory-fraction must be in (0, 1]; got ",
               o.memory_fraction);
  TANDEM_CHECK(o.gpu_memory_gib >= 0 && o.kv_cache_gib >= 0, "--gpu-memory-gib and --kv-cache-gib must be >= 0");
  GenerationModel g;
  g.folder = open_model_folder(o.checkpoint);
  g.tokenizer = open_tokenizer(o.tokenizer.empty() ? g.folder.dir : o.tokenizer);  // before the weights: fail fast
  if (g.tokenizer->vocab_size() > g.folder.spec.vocab_size)
    log::warn(strprintf("the tokenizer has %lld tokens, the model %lld: ids beyond the model's are refused",
                        static_cast<long long>(g.tokenizer->vocab_size()),
                        static_cast<long long>(g.folder.spec.vocab_size)));
  g.eos_ids = merged_eos(*g.tokenizer, g.folder.eos_ids);
  g.device = choose_generation_device(o.device, &g.device_choice);
  const auto dtype = generation_dtype(o.dtype, g.device);

  KvCacheShape shape;
  shape.n_layer = g.folder.spec.n_layer;
  shape.n_kv_head = g.folder.spec.n_kv_head;
  shape.head_dim = g.folder.spec.head_dim();
  shape.page_tokens = o.page_tokens;
  shape.dtype = dtype;
  shape.device = g.device;
  const MemoryPlan memory = plan_memory(o, g.folder.spec, shape, g.device, dtype);
  WeightPlacement placement;
  placement.device = g.device;
  placement.dtype = dtype;
  placement.plan = memory.weights;
  const WeightFiles files(g.folder.dir, family_names(g.folder.spec.family).base);
  const TensorUse use(files.names(), files.source());  // Note [Every tensor used]
  if (g.folder.spec.tie_embeddings) use.mark_used("lm_head.weight");
  auto weights =
      std::make_shared<DecoderWeights>(g.folder.spec, placement, use.recording(files.lookup()), files.source());
  use.check_all_used();
  g.decoder = std::make_unique<Decoder>(std::move(weights));
  g.cache = std::make_unique<KvCache>(shape, memory.kv_bytes);
  g.max_batch = memory.max_batch;
  g.max_batch_source = memory.max_batch_source;
  g.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return g;
}

std::string GenerationModel::description() const {
  const auto& s = folder.spec;
  const auto& placement = decoder->weights().placement();
  std::string out = strprintf(
      "model %s: %s, %lld layers, d_model %lld, %lld heads (%lld key/value), context %lld, %s parameters\n",
      folder.dir.c_str(), to_string(s.family), static_cast<long long>(s.n_layer), static_cast<long long>(s.d_model),
      static_cast<long long>(s.n_head), static_cast<long long>(s.n_kv_head), static_cast<long long>(s.max_seq_len),
      format_count(double(s.num_params_unpadded())).c_str());
  out += strprintf("device %s (%s), %s; weights: %s\n", device.str().c_str(), device_choice.c_str(),
                   dtype_name(placement.dtype), placement.plan.describe().c_str());
  out += strprintf("KV cache: %lld pages of %lld tokens (%lld tokens, %s); batch up to %lld sequences (%s); "
                   "tokenizer: %s\n",
                   static_cast<long long>(cache->pages_total()), static_cast<long long>(cache->page_tokens()),
                   static_cast<long long>(cache->tokens_total()), format_bytes(double(cache->bytes())).c_str(),
                   static_cast<long long>(max_batch), max_batch_source.c_str(), tokenizer->description().c_str());
  return out;
}

}  // namespace tandem
