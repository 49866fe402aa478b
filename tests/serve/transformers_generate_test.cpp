// Greedy generation against transformers itself: a tiny LlamaForCausalLM saved by transformers
// (tests/serve/transformers_generate_fixture.py, run in the project's Python: .venv, TANDEM_PYTHON)
// and loaded as `tandem generate --checkpoint` loads it gives transformers' generate() tokens, token
// for token, for prompts of several lengths decoded together, with every layer resident and with
// the layers streamed from host memory. Skipped without transformers.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "../test_util.h"
#include "../transformers_fixture.h"
#include "tandem/formats/safetensors.h"
#include "tandem/serve/batch_scheduler.h"
#include "tandem/serve/generation_model.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

constexpr const char* kMagic = "tandem-generate-reference";
constexpr const char* kVersion = "1";

class ServeTransformersGenerate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    skip_ = test::transformers_missing();
    if (!skip_.empty()) return;
    dir_ = new test::TempDir;
    error_ = test::run_python_fixture("tests/serve/transformers_generate_fixture.py",
                                      "write " + test::shell_quoted(dir_->path()), dir_->file("fixture.log"));
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_EQ(error_, "");
  }

  /// Generates every reference prompt at once with `model` and compares with transformers.
  static void expect_reference(GenerationModel& model) {
    SafetensorsFile ref(dir_->file("reference.safetensors"));
    ASSERT_EQ(ref.metadata().at("magic"), kMagic);
    ASSERT_EQ(ref.metadata().at("version"), kVersion);
    BatchScheduler s(*model.decoder, *model.cache, model.tokenizer.get(), {});
    const size_t n = ref.names().size() / 2;
    std::vector<std::vector<TokenId>> got(n);
    std::vector<std::vector<TokenId>> want(n);
    for (size_t i = 0; i < n; ++i) {
      want[i] = test::ids_of(ref.tensor("output_" + std::to_string(i)));
      auto r = test::greedy_request(test::ids_of(ref.tensor("prompt_" + std::to_string(i))),
                                    static_cast<int64_t>(want[i].size()), got[i]);
      ASSERT_EQ(s.submit(std::move(r)).admission, Admission::kAccepted);
    }
    s.wait_idle();
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
  }

  static GenerationModelOptions options() {
    GenerationModelOptions o;
    o.checkpoint = dir_->file("model");
    o.tokenizer = "byte";
    o.device = "cpu";
    return o;
  }

  static std::string skip_, error_;
  static test::TempDir* dir_;
};
std::string ServeTransformersGenerate::skip_, ServeTransformersGenerate::error_;
test::TempDir* ServeTransformersGenerate::dir_ = nullptr;

TEST_F(ServeTransformersGenerate, GreedyTokensEqualTransformers) {
  auto model = load_generation_model(options());
  EXPECT_EQ(model.decoder->weights().placement().plan.streamed(), 0);
  EXPECT_EQ(model.decoder->dtype(), torch::kFloat32);
  expect_reference(model);
}

TEST_F(ServeTransformersGenerate, GreedyTokensEqualTransformersWithStreamedLayers) {
  auto o = options();
  o.prefetch_layers = 1;  // two slots
  const auto spec = open_model_folder(o.checkpoint).spec;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const int64_t kv = 1 << 20, fixed = decoder_fixed_numel(spec) * 4, layer = decoder_layer_numel(spec) * 4;
  o.kv_cache_gib = kv / gib;
  o.gpu_memory_gib = double(kv + fixed + 2 * layer + layer / 2) / gib;  // the slots and half a layer more
  auto model = load_generation_model(o);
  const auto& plan = model.decoder->weights().placement().plan;
  EXPECT_EQ(plan.streamed(), 3);
  EXPECT_EQ(plan.slots, 2);
  expect_reference(model);
  EXPECT_GT(model.decoder->weights().uploads(), 3 * 24);
}

// On a GPU in fp32, the streamed layers in pinned host memory, uploaded on a side stream.
TEST_F(ServeTransformersGenerate, GreedyTokensEqualTransformersOnCudaWithStreamedLayers) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto o = options();
  o.device = "cuda";
  o.dtype = "fp32";
  o.prefetch_layers = 1;
  const auto spec = open_model_folder(o.checkpoint).spec;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const int64_t kv = 1 << 20, fixed = decoder_fixed_numel(spec) * 4, layer = decoder_layer_numel(spec) * 4;
  o.kv_cache_gib = kv / gib;
  o.gpu_memory_gib = double(kv + fixed + 2 * layer + layer / 2) / gib;
  auto model = load_generation_model(o);
  EXPECT_TRUE(model.device.is_cuda());
  EXPECT_EQ(model.decoder->weights().placement().plan.streamed(), 3);
  expect_reference(model);
}

}  // namespace
}  // namespace tandem
