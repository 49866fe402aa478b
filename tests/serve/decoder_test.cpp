// The generation forward against tandem's own Model::forward on the same weights: incremental
// decoding over a paged KV cache gives the full forward's logits at every step, for sequences of
// different lengths joining at different steps, prompts continued in chunks, pages out of order and
// spanning page boundaries; and streaming layers from host memory changes nothing.

#include "tandem/serve/decoder.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <random>

#include "../test_util.h"
#include "serve_test_util.h"

namespace tandem {
namespace {

// fp32 on both sides: what differs is summation order (a fused QKV product, attention over padded
// pages): about 1e-6 measured at logits of order 10.
constexpr double kRtol = 2e-5, kAtol = 2e-5;

struct Seq {
  std::vector<TokenId> tokens;
  std::vector<int64_t> chunks;  // tokens added per step from its first step on (0 = one decode token)
  int first_step = 0;
  int64_t cached = 0;
  PageTable pages;
};

// Sequences joining at steps 0, 1, 2 and 4; the one of 10 prompt tokens is prefilled in two chunks
// (6, then 4 continuing at position 6: the masked path); the others decode one token a step.
std::vector<Seq> schedule(int64_t vocab) {
  std::mt19937 rng(7);
  const auto prompt = [&](int64_t n) {
    std::vector<TokenId> t;
    for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<TokenId>(rng() % vocab));
    return t;
  };
  std::vector<Seq> s(5);
  s[0].tokens = prompt(7), s[0].first_step = 0;
  s[1].tokens = prompt(21), s[1].first_step = 1;
  s[2].tokens = prompt(1), s[2].first_step = 2;
  s[3].tokens = prompt(10), s[3].first_step = 1, s[3].chunks = {6, 4};
  s[4].tokens = prompt(5), s[4].first_step = 4;
  return s;
}

/// Runs the schedule for `steps` steps; per step the logits of every new token (kAll), and checks
/// them against the full forward of `reference` when given.
std::vector<torch::Tensor> run_schedule(Decoder& decoder, Model* reference, int steps, double rtol = kRtol,
                                        double atol = kAtol) {
  const int64_t V = decoder.spec().vocab_size;
  KvCache cache(decoder.cache_shape(4), 64 * decoder.cache_shape(4).page_bytes());
  {  // scramble the free list, so that sequences get pages out of order
    PageTable a, b;
    EXPECT_TRUE(cache.reserve(a, 4 * 5));
    EXPECT_TRUE(cache.reserve(b, 4 * 3));
    cache.release(a);
  }
  auto seqs = schedule(V);
  std::mt19937 rng(11);
  std::vector<torch::Tensor> out;
  for (int step = 0; step < steps; ++step) {
    std::vector<SequenceChunk> batch;
    std::vector<Seq*> in;
    for (auto& s : seqs) {
      if (step < s.first_step) continue;
      const size_t k = static_cast<size_t>(step - s.first_step);
      const int64_t total = static_cast<int64_t>(s.tokens.size());
      const int64_t n = k < s.chunks.size() ? s.chunks[k] : total - s.cached;
      EXPECT_TRUE(cache.reserve(s.pages, s.cached + n));
      batch.push_back(
          {&s.pages, s.cached, std::vector<TokenId>(s.tokens.begin() + s.cached, s.tokens.begin() + s.cached + n)});
      in.push_back(&s);
    }
    const auto logits = decoder.forward(batch, cache, LogitRows::kAll);  // (N, V)
    out.push_back(logits);
    int64_t row = 0;
    for (size_t b = 0; b < batch.size(); ++b) {
      auto& s = *in[b];
      const auto n = static_cast<int64_t>(batch[b].tokens.size()), end = s.cached + n;
      if (reference != nullptr) {
        torch::NoGradGuard no_grad;
        const auto ids = torch::tensor(std::vector<int64_t>(s.tokens.begin(), s.tokens.begin() + end)).view({1, end});
        const auto full = reference->forward(ids)[0].narrow(-1, 0, V);  // (end, V)
        EXPECT_TRUE(test::AllClose(logits.narrow(0, row, n), full.narrow(0, s.cached, n), rtol, atol))
            << "step " << step << ", sequence " << (&s - seqs.data()) << ", positions " << s.cached << ".." << end;
      }
      row += n;
      s.cached = end;
      if (s.cached == static_cast<int64_t>(s.tokens.size())) s.tokens.push_back(static_cast<TokenId>(rng() % V));
    }
  }
  for (auto& s : seqs) cache.release(s.pages);
  return out;
}

/// One sequence alone: a prompt of 5 tokens, then steps-1 decode steps of one row; each step's logits.
std::vector<torch::Tensor> decode_alone(Decoder& decoder, int steps) {
  const int64_t V = decoder.spec().vocab_size;
  KvCache cache(decoder.cache_shape(1), 16 * decoder.cache_shape(1).page_bytes());
  PageTable pages;
  std::vector<TokenId> tokens{1, 2, 3, 4, 5};
  int64_t cached = 0;
  std::vector<torch::Tensor> out;
  for (int step = 0; step < steps; ++step) {
    const auto end = static_cast<int64_t>(tokens.size());
    EXPECT_TRUE(cache.reserve(pages, end));
    const std::vector<SequenceChunk> batch{
        {&pages, cached, std::vector<TokenId>(tokens.begin() + cached, tokens.end())}};
    out.push_back(decoder.forward(batch, cache, LogitRows::kAll));
    cached = end;
    tokens.push_back(static_cast<TokenId>((7 * step + 3) % V));
  }
  cache.release(pages);
  return out;
}

TEST(ServeDecoder, IncrementalDecodingEqualsTheFullForward) {
  const auto model = test::random_llama(test::small_llama_spec(), 3);
  auto decoder = test::decoder_of(*model);
  const auto logits = run_schedule(*decoder, model.get(), 9);
  ASSERT_EQ(logits.size(), 9u);
  // The reference is not trivially matched: the logits differ between positions.
  EXPECT_GT((logits[0][0] - logits[0][1]).abs().max().item<double>(), 1.0);
}

// Note [No per-shape attention plans]: a step that prefills switches LibTorch's process-wide cuDNN
// attention off for itself and leaves the switch as it found it, on or off.
TEST(ServeDecoder, StepsThatPrefillLeaveTheCudnnAttentionSwitchAsItWas) {
  const auto model = test::random_llama(test::small_llama_spec(), 3);
  auto decoder = test::decoder_of(*model);
  const bool before = at::globalContext().userEnabledCuDNNSDP();
  for (const bool on : {true, false}) {
    at::globalContext().setSDPUseCuDNN(on);
    run_schedule(*decoder, model.get(), 5);  // prefills from the start and a masked continuation
    EXPECT_EQ(at::globalContext().userEnabledCuDNNSDP(), on);
  }
  at::globalContext().setSDPUseCuDNN(before);
}

TEST(ServeDecoder, TiedEmbeddingsAndOneKeyValueHead) {
  auto spec = test::small_llama_spec();
  spec.tie_embeddings = true, spec.n_kv_head = 1, spec.d_ff = 64;
  const auto model = test::random_llama(spec, 4);
  auto decoder = test::decoder_of(*model);
  run_schedule(*decoder, model.get(), 6);
}

TEST(ServeDecoder, Bf16StaysNearTheFp32Forward) {
  const auto model = test::random_llama(test::small_llama_spec(), 5);
  auto fp32 = test::decoder_of(*model);
  auto bf16 = test::decoder_of(*model, torch::kBFloat16);
  const auto a = run_schedule(*fp32, nullptr, 5), b = run_schedule(*bf16, nullptr, 5);
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = a[i].abs().max().item<double>();
    EXPECT_TRUE(test::AllClose(b[i], a[i], 0.0, 0.05 * scale)) << "step " << i;
  }
}

TEST(ServeDecoder, StreamedLayersEqualResidentOnes) {
  const auto spec = test::small_llama_spec();
  const auto model = test::random_llama(spec, 6);
  const int64_t layer = decoder_layer_numel(spec) * 4, fixed = decoder_fixed_numel(spec) * 4;
  auto resident = test::decoder_of(*model);
  auto streamed = test::decoder_of(*model, torch::kFloat32, fixed + 3 * layer, /*prefetch=*/1);
  const auto& plan = streamed->weights().placement().plan;
  ASSERT_EQ(plan.slots, 2);
  ASSERT_EQ(plan.streamed(), 3);  // two slots for three streamed layers: every pass uploads each
  const int steps = 7;
  const auto a = run_schedule(*resident, nullptr, steps), b = run_schedule(*streamed, nullptr, steps);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "step " << i;
  EXPECT_GE(streamed->weights().uploads(), 3 * steps);
  EXPECT_EQ(resident->weights().uploads(), 0);
}

TEST(ServeResidencyPlan, KeepsTheFirstLayersThatFit) {
  const auto spec = test::small_llama_spec();
  const int64_t layer = decoder_layer_numel(spec) * 2, fixed = decoder_fixed_numel(spec) * 2;
  const auto all = plan_residency(spec, torch::kBFloat16, -1, 2);
  EXPECT_EQ(all.streamed(), 0);
  EXPECT_EQ(all.device_bytes(), fixed + 4 * layer);
  EXPECT_EQ(plan_residency(spec, torch::kBFloat16, fixed + 4 * layer, 2).streamed(), 0);
  const auto some = plan_residency(spec, torch::kBFloat16, fixed + 4 * layer - 1, 1);  // slots 2: 1 resident
  EXPECT_EQ(some.slots, 2);
  EXPECT_EQ(some.resident(), 1);
  EXPECT_EQ(some.layers[0], LayerHome::kDevice);
  EXPECT_EQ(some.layers[3], LayerHome::kHost);
  EXPECT_LE(some.device_bytes(), fixed + 4 * layer - 1);
  EXPECT_EQ(some.host_bytes(), 3 * layer);
  EXPECT_NE(test::error_of([&] {
              plan_residency(spec, torch::kBFloat16, fixed + layer, 1);
            }).find("does not hold the embedding"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { plan_residency(spec, torch::kBFloat16, fixed, 0); }).find("--prefetch-layers"),
            std::string::npos);
}

TEST(ServeDecoderWeights, MissingOrMisshapenTensorsAreNamed) {
  const auto model = test::random_llama(test::small_llama_spec(), 8);
  const auto good = test::lookup_of(*model);
  WeightPlacement p;
  p.plan = plan_residency(model->spec(), torch::kFloat32, -1, 1);
  const auto without = [&](const std::string& gone) -> TensorLookup {
    return [&, gone](const std::string& n) -> std::optional<torch::Tensor> {
      if (n == gone) return std::nullopt;
      return good(n);
    };
  };
  EXPECT_NE(test::error_of([&] {
              DecoderWeights(model->spec(), p, without("model.layers.2.mlp.up_proj.weight"), "f");
            }).find("'model.layers.2.mlp.up_proj.weight' is missing"),
            std::string::npos);
  auto other = model->spec();
  other.d_ff = 48;
  EXPECT_NE(test::error_of([&] { DecoderWeights(other, p, good, "f"); }).find("has shape"), std::string::npos);
}

// The same on a GPU: the CUDA kernels against the CPU's full forward (cuBLAS and the attention
// kernels sum in other orders: a looser bound), and layers streamed through pinned host memory on
// a side stream, ordered by events, against resident ones, bit for bit.
TEST(ServeDecoderGpu, IncrementalDecodingOnCudaEqualsTheCpuForward) {
  REQUIRE_CUDA();
  const auto model = test::random_llama(test::small_llama_spec(), 3);
  auto decoder = test::decoder_of(*model, torch::kFloat32, -1, 1, c10::Device(c10::kCUDA, 0));
  run_schedule(*decoder, model.get(), 9, 1e-4, 1e-4);
}

// Heads of 64 take the paged decode-attention kernel (Note [Paged decode attention]): the
// decoder with it against the CPU's full forward, with and without a sliding window.
TEST(ServeDecoderGpu, PagedAttentionOnCudaEqualsTheCpuForward) {
  REQUIRE_CUDA();
  auto spec = test::small_llama_spec();
  spec.d_model = 256, spec.n_head = 4, spec.n_kv_head = 2;
  for (const int64_t window : {int64_t{0}, int64_t{6}}) {
    spec.parts.sliding_window = window;
    const auto model = test::random_llama(spec, 3);
    auto decoder = test::decoder_of(*model, torch::kFloat32, -1, 1, c10::Device(c10::kCUDA, 0));
    ASSERT_TRUE(decoder->paged_attention());
    run_schedule(*decoder, model.get(), 9, 1e-4, 1e-4);
  }
}

// The fused kernels (Note [Decode fusions], Note [Paged decode attention]) and the packed prefills
// (Note [Packed prefill attention]: fresh prompts, several joining in one step, a continuation)
// against LibTorch's ops and one attention call per chunk (TANDEM_DECODE_KERNELS=torch) on the same
// GPU in bf16, with and without a sliding window: the same schedule's logits within bf16's rounding
// of the values.
TEST(ServeDecoderGpu, FusedKernelsStayWithinBf16RoundingOfLibTorchsOps) {
  REQUIRE_CUDA();
  auto spec = test::small_llama_spec();
  spec.d_model = 256, spec.n_head = 4, spec.n_kv_head = 2;
  for (const int64_t window : {int64_t{0}, int64_t{5}}) {
    spec.parts.sliding_window = window;
    const auto model = test::random_llama(spec, 5);
    const c10::Device cuda(c10::kCUDA, 0);
    auto fused = test::decoder_of(*model, torch::kBFloat16, -1, 1, cuda);
    ::setenv("TANDEM_DECODE_KERNELS", "torch", 1);
    auto plain = test::decoder_of(*model, torch::kBFloat16, -1, 1, cuda);
    ::unsetenv("TANDEM_DECODE_KERNELS");
    EXPECT_TRUE(fused->paged_attention());
    EXPECT_FALSE(plain->paged_attention());
    EXPECT_TRUE(fused->packed_prefill());
    EXPECT_FALSE(plain->packed_prefill());
    const auto a = run_schedule(*fused, nullptr, 9), b = run_schedule(*plain, nullptr, 9);
    for (size_t i = 0; i < a.size(); ++i) {
      const double scale = b[i].abs().max().item<double>();
      EXPECT_TRUE(test::AllClose(a[i], b[i], 0, 0.03 * scale)) << "window " << window << ", step " << i;
    }
  }
}

TEST(ServeDecoder, AnUnknownChoiceOfDecodeKernelsIsNamed) {
  const auto model = test::random_llama(test::small_llama_spec(), 3);
  ::setenv("TANDEM_DECODE_KERNELS", "fast", 1);
  const auto message = test::error_of([&] { test::decoder_of(*model); });
  ::unsetenv("TANDEM_DECODE_KERNELS");
  EXPECT_NE(message.find("TANDEM_DECODE_KERNELS=fast is not a choice of decode kernels; use fused or norms-apart or "
                         "persistent or separate or torch"),
            std::string::npos)
      << message;
}

// The products with their epilogues (Note [Skinny epilogues]) against the same kernels apart
// (TANDEM_DECODE_KERNELS=separate): the same schedule's logits, bit for bit, in bf16 and fp32.
TEST(ServeDecoderGpu, SkinnyEpiloguesGiveTheSeparateKernelsLogits) {
  REQUIRE_CUDA();
  auto spec = test::small_llama_spec();
  spec.d_model = 256, spec.n_head = 4, spec.n_kv_head = 2;
  const auto model = test::random_llama(spec, 9);
  const c10::Device cuda(c10::kCUDA, 0);
  for (const auto dtype : {torch::kBFloat16, torch::kFloat32}) {
    ::setenv("TANDEM_DECODE_KERNELS", "fused", 1);
    auto fused = test::decoder_of(*model, dtype, -1, 1, cuda);
    ::setenv("TANDEM_DECODE_KERNELS", "separate", 1);
    auto separate = test::decoder_of(*model, dtype, -1, 1, cuda);
    ::unsetenv("TANDEM_DECODE_KERNELS");
    const auto a = run_schedule(*fused, nullptr, 9), b = run_schedule(*separate, nullptr, 9);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "step " << i << ", " << dtype;
  }
}

// Note [Norm in the product]: the products that form their own norms give the logits of the norms
// in their own kernels, bit for bit, at widths whose rows fit the shared memory at every batch.
TEST(ServeDecoderGpu, NormsInTheProductsGiveTheNormKernelsLogits) {
  REQUIRE_CUDA();
  auto spec = test::small_llama_spec();
  spec.d_model = 256, spec.n_head = 4, spec.n_kv_head = 2;
  const auto model = test::random_llama(spec, 10);
  const c10::Device cuda(c10::kCUDA, 0);
  for (const auto dtype : {torch::kBFloat16, torch::kFloat32}) {
    ::setenv("TANDEM_DECODE_KERNELS", "fused", 1);
    auto fused = test::decoder_of(*model, dtype, -1, 1, cuda);
    ::setenv("TANDEM_DECODE_KERNELS", "norms-apart", 1);
    auto apart = test::decoder_of(*model, dtype, -1, 1, cuda);
    ::unsetenv("TANDEM_DECODE_KERNELS");
    auto a = run_schedule(*fused, nullptr, 10), b = run_schedule(*apart, nullptr, 10);
    const auto a1 = decode_alone(*fused, 6), b1 = decode_alone(*apart, 6);
    a.insert(a.end(), a1.begin(), a1.end());
    b.insert(b.end(), b1.begin(), b1.end());
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "step " << i << ", " << dtype;
    // the schedule's step of four decodes and the five of one sequence alone, two products a layer
    EXPECT_EQ(fused->normed_products(), 2 * spec.n_layer * 6) << dtype;
    EXPECT_EQ(apart->normed_products(), 0) << dtype;
  }
}

// A bad TANDEM_DEPENDENT_LAUNCH is refused when the decoder is built, on any device, not at its
// first launch on a GPU.
TEST(ServeDecoder, AnUnknownDependentLaunchSettingIsNamedWhenTheDecoderIsBuilt) {
  const auto model = test::random_llama(test::small_llama_spec(), 3);
  ::setenv("TANDEM_DEPENDENT_LAUNCH", "sometimes", 1);
  const auto message = test::error_of([&] { test::decoder_of(*model); });
  ::unsetenv("TANDEM_DEPENDENT_LAUNCH");
  EXPECT_NE(
      message.find("TANDEM_DEPENDENT_LAUNCH=sometimes is not a choice of dependent launch settings; use on or off"),
      std::string::npos)
      << message;
}

TEST(ServeDecoderGpu, StreamedLayersOnCudaEqualResidentOnes) {
  REQUIRE_CUDA();
  const auto spec = test::small_llama_spec();
  const auto model = test::random_llama(spec, 6);
  const c10::Device cuda(c10::kCUDA, 0);
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const auto elem = static_cast<int64_t>(c10::elementSize(dtype));
    const int64_t layer = decoder_layer_numel(spec) * elem, fixed = decoder_fixed_numel(spec) * elem;
    auto resident = test::decoder_of(*model, dtype, -1, 1, cuda);
    auto streamed = test::decoder_of(*model, dtype, fixed + 3 * layer, 1, cuda);
    ASSERT_EQ(streamed->weights().placement().plan.streamed(), 3);
    const auto a = run_schedule(*resident, nullptr, 12), b = run_schedule(*streamed, nullptr, 12);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "step " << i << ", " << dtype;
  }
}

}  // namespace
}  // namespace tandem
