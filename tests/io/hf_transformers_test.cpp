// tandem against transformers itself: checkpoints that transformers wrote (config.json in its 5.x
// layout and rewritten in its 4.x layout) load into the model transformers computes, logit for
// logit; and transformers loads what tandem writes into the model tandem computes.
// tests/io/hf_transformers_fixture.py runs in the project's Python (.venv, TANDEM_PYTHON); without
// it or without transformers there, the tests are skipped.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "../test_util.h"
#include "../transformers_fixture.h"
#include "tandem/io/hf.h"
#include "tandem/formats/safetensors.h"
#include "tandem/models/model.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// Written by the fixture script into its files' metadata.
constexpr const char* kMagic = "tandem-hf-reference";
constexpr const char* kVersion = "1";

// fp32 on both sides: what is left is summation order and transcendental functions.
constexpr double kRtol = 1e-4, kAtol = 1e-4;

std::string run_fixture(const std::string& args, const std::string& log) {
  return test::run_python_fixture("tests/io/hf_transformers_fixture.py", args, log);
}

/// A fixture file, checked to be one the script wrote in the version this test reads.
std::unique_ptr<SafetensorsFile> open_reference(const std::string& path) {
  auto f = std::make_unique<SafetensorsFile>(path);
  const auto& meta = f->metadata();
  const auto magic = meta.find("magic"), version = meta.find("version");
  EXPECT_TRUE(magic != meta.end() && magic->second == kMagic) << path << " is not a fixture file";
  EXPECT_TRUE(version != meta.end() && version->second == kVersion) << path << ": fixture version differs";
  return f;
}

/// The model's logits over the real vocabulary: (B, T, vocab_size) fp32.
torch::Tensor logits_of(Model& model, const torch::Tensor& ids) {
  torch::NoGradGuard no_grad;
  return model.forward(ids).narrow(-1, 0, model.spec().vocab_size);
}

class HfTransformers : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { skip_ = test::transformers_missing(); }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
  }

  static std::string skip_;
};
std::string HfTransformers::skip_;

TEST_F(HfTransformers, CheckpointsLoadIntoTheModelTransformersComputes) {
  test::TempDir dir;  // the fixture's checkpoints and reference.safetensors
  ASSERT_EQ(run_fixture("write " + test::shell_quoted(dir.path()), dir.file("write.log")), "");
  const auto ref = open_reference(dir.file("reference.safetensors"));
  for (const std::string name : {"llama3", "default_tied"}) {
    const auto ids = ref->tensor(name + ".input_ids");    // (B, T) int64
    const auto expected = ref->tensor(name + ".logits");  // (B, T, vocab) fp32
    for (const std::string layout : {"v5", "v4"}) {
      SCOPED_TRACE(name + " config.json in the transformers " + layout + " layout");
      const std::string ckpt = dir.file(name + "_" + layout);
      const ModelSpec spec = spec_from_hf_config(ckpt + "/config.json");
      if (name == "llama3") {
        EXPECT_EQ(spec.rope_theta, 500000.0);
        EXPECT_EQ(spec.rope_scaling.factor, 8.0);
        EXPECT_EQ(spec.rope_scaling.original_max_position, 32);
        EXPECT_EQ(spec.n_kv_head, 2);
      } else {
        EXPECT_EQ(spec.rope_theta, 10000.0);
        EXPECT_EQ(spec.rope_scaling.factor, 0.0);
        EXPECT_TRUE(spec.tie_embeddings);
      }
      Model model(spec, false);
      load_hf_weights(model, ckpt);
      EXPECT_TRUE(test::AllClose(logits_of(model, ids), expected, kRtol, kAtol));
    }
  }
  // The comparison sees the RoPE settings: the same weights with the theta-10000, unscaled RoPE
  // that a config's rope_parameters used to be read as give other logits.
  ModelSpec wrong = spec_from_hf_config(dir.file("llama3_v5/config.json"));
  wrong.rope_theta = 10000.0;
  wrong.rope_scaling = RopeScaling{};
  Model model(wrong, false);
  load_hf_weights(model, dir.file("llama3_v5"));
  EXPECT_FALSE(
      test::AllClose(logits_of(model, ref->tensor("llama3.input_ids")), ref->tensor("llama3.logits"), kRtol, kAtol));
}

TEST_F(HfTransformers, TransformersLoadsWhatTandemWrites) {
  ModelSpec llama3 = preset_spec("tiny");
  llama3.n_layer = 2, llama3.d_model = 64, llama3.n_head = 4, llama3.n_kv_head = 2, llama3.d_ff = 176;
  llama3.vocab_size = 97, llama3.max_seq_len = 128, llama3.tie_embeddings = false;
  llama3.rope_theta = 500000.0;
  llama3.rope_scaling = RopeScaling{RopeType::kLlama3, 8.0, 1.0, 4.0, 32};
  ModelSpec tied = llama3;
  tied.n_kv_head = 4, tied.d_ff = 128, tied.vocab_size = 101, tied.tie_embeddings = true;
  tied.rope_theta = 10000.0;
  tied.rope_scaling = RopeScaling{};
  test::TempDir dir;
  int seed = 0;
  for (const ModelSpec& spec : {llama3, tied}) {
    SCOPED_TRACE(spec.tie_embeddings ? "tied, default RoPE" : "llama3 RoPE");
    torch::manual_seed(++seed);
    Model model(spec, false);
    {  // Weights large enough that attention is far from uniform (the checkpoint's real part only).
      torch::NoGradGuard no_grad;
      for (auto& [name, t] : model.hf_state_dict()) {
        if (t.dim() == 1)
          t.normal_(1.0, 0.2);  // RMSNorm scales
        else
          t.normal_(0.0, 1.5 / std::sqrt(static_cast<double>(t.size(1))));
      }
    }
    const std::string ckpt = dir.file("tandem_" + std::to_string(seed));
    fs::create_directories(ckpt);
    save_hf_model(model, ckpt);
    const std::string out = ckpt + "/transformers.safetensors";
    ASSERT_EQ(run_fixture("forward " + test::shell_quoted(ckpt) + " " + test::shell_quoted(out), ckpt + "/forward.log"),
              "");
    const auto ref = open_reference(out);
    EXPECT_TRUE(test::AllClose(logits_of(model, ref->tensor("input_ids")), ref->tensor("logits"), kRtol, kAtol));
  }
}

}  // namespace
}  // namespace tandem
