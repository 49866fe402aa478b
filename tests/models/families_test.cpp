// Every decoder family tandem reads (Note [Decoder families]) against transformers itself, on tiny
// models whose every weight, norm scale and bias is random (tests/models/families_fixture.py, run in
// the project's Python: .venv, TANDEM_PYTHON): logits and the causal-LM loss equal transformers' in
// fp32; the folder tandem writes loads in transformers with the same logits; greedy generation over
// the paged KV cache (sliding windows included) gives transformers' tokens; and the offload engine
// trains each family from its folder into a checkpoint transformers reads. Skipped without
// transformers.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../cli/cli_run.h"
#include "../test_util.h"
#include "../transformers_fixture.h"
#include "tandem/io/hf.h"
#include "tandem/formats/safetensors.h"
#include "tandem/models/model.h"
#include "tandem/serve/batch_scheduler.h"
#include "tandem/serve/generation_model.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

constexpr const char* kMagic = "tandem-families-reference";
constexpr const char* kVersion = "1";
const std::vector<std::string> kCases = {"qwen2", "qwen2_window", "mistral",      "gemma",         "gemma2",    "phi3",
                                         "gpt2",  "llama_bias",   "llama_linear", "llama_dynamic", "llama_yarn"};

std::string run_fixture(const std::string& args, const std::string& log) {
  return test::run_python_fixture("tests/models/families_fixture.py", args, log);
}

/// max |a - b| over max |b|: fp32 on both sides leaves summation order and transcendentals.
double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-30);
}
constexpr double kRelative = 1e-5;

std::shared_ptr<Model> load_folder(const std::string& dir) {
  const ModelSpec spec = spec_from_hf_config((fs::path(dir) / "config.json").string());
  auto model = build_model(spec, false);
  load_hf_weights(*model, dir);
  model->eval();
  return model;
}

torch::Tensor logits_of(Model& model, const torch::Tensor& ids) {
  torch::NoGradGuard no_grad;
  return model.forward(ids).narrow(-1, 0, model.spec().vocab_size);
}

class Families : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    skip_ = test::transformers_missing();
    if (!skip_.empty()) return;
    dir_ = new test::TempDir;
    error_ = run_fixture("write " + test::shell_quoted(dir_->path()), dir_->file("write.log"));
    if (error_.empty()) ref_ = new SafetensorsFile(dir_->file("reference.safetensors"));
  }
  static void TearDownTestSuite() {
    delete ref_;
    delete dir_;
    ref_ = nullptr, dir_ = nullptr;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_EQ(error_, "");
    ASSERT_EQ(ref_->metadata().at("magic"), kMagic);
    ASSERT_EQ(ref_->metadata().at("version"), kVersion);
  }
  static std::string folder(const std::string& c) { return dir_->file(c); }
  static torch::Tensor ref(const std::string& name) { return ref_->tensor(name); }

  static std::string skip_, error_;
  static test::TempDir* dir_;
  static SafetensorsFile* ref_;
};
std::string Families::skip_, Families::error_;
test::TempDir* Families::dir_ = nullptr;
SafetensorsFile* Families::ref_ = nullptr;

TEST_F(Families, LogitsAndLossEqualTransformers) {
  for (const auto& c : kCases) {
    SCOPED_TRACE(c);
    auto model = load_folder(folder(c));
    const auto ids = ref(c + ".input_ids");
    const auto logits = logits_of(*model, ids);
    EXPECT_LT(relative_error(logits, ref(c + ".logits")), kRelative);
    const int64_t T = ids.size(1);
    const auto loss = model->cross_entropy(logits.narrow(1, 0, T - 1), ids.narrow(1, 1, T - 1));
    EXPECT_LT(relative_error(loss.reshape({1}), ref(c + ".loss")), kRelative);
  }
}

TEST_F(Families, TransformersLoadsWhatTandemWritesWithTheSameLogits) {
  test::TempDir out;
  for (const auto& c : kCases) {
    SCOPED_TRACE(c);
    auto model = load_folder(folder(c));
    fs::create_directories(out.file(c));
    save_hf_model(*model, out.file(c));
    const auto original = nlohmann::json::parse(test::read_text(folder(c) + "/config.json"));
    const auto written = nlohmann::json::parse(test::read_text(out.file(c) + "/config.json"));
    EXPECT_EQ(written.at("model_type"), original.at("model_type"));
    EXPECT_EQ(written.at("architectures"), original.at("architectures"));
    ASSERT_EQ(run_fixture(
                  "forward " + test::shell_quoted(out.file(c)) + " " + test::shell_quoted(out.file(c + ".safetensors")),
                  out.file(c + ".log")),
              "");
    SafetensorsFile theirs(out.file(c + ".safetensors"));
    const auto ids = theirs.tensor("input_ids");
    EXPECT_LT(relative_error(theirs.tensor("logits"), logits_of(*model, ids)), kRelative);
    // And tandem reads its own folder as the same model.
    EXPECT_EQ(hf_config_json(spec_from_hf_config(out.file(c) + "/config.json")), hf_config_json(model->spec()));
  }
}

TEST_F(Families, GreedyGenerationEqualsTransformers) {
  for (const auto& c : kCases) {
    SCOPED_TRACE(c);
    GenerationModelOptions o;
    o.checkpoint = folder(c);
    o.tokenizer = "byte";
    o.device = "cpu";
    auto model = load_generation_model(o);
    BatchScheduler s(*model.decoder, *model.cache, model.tokenizer.get(), {});
    std::vector<std::vector<TokenId>> got(3), want(3);
    for (size_t i = 0; i < got.size(); ++i) {  // submitted together: decoded in one batch
      want[i] = test::ids_of(ref(c + ".output_" + std::to_string(i)));
      auto r = test::greedy_request(test::ids_of(ref(c + ".prompt_" + std::to_string(i))),
                                    static_cast<int64_t>(want[i].size()), got[i]);
      ASSERT_EQ(s.submit(std::move(r)).admission, Admission::kAccepted);
    }
    s.wait_idle();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
  }
}

// `tandem train --init-from` with the offload engine (CPU update), then transformers reads the
// trained checkpoint as tandem computes it.
TEST_F(Families, TheOffloadEngineTrainsEachFamilyIntoACheckpointTransformersReads) {
  test::TempDir out;
  {
    std::vector<uint16_t> tokens(4000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 31 + i / 7) % 97);
    std::ofstream(out.file("tokens.bin"), std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()), 2 * static_cast<std::streamsize>(tokens.size()));
  }
  for (const std::string c : {"qwen2_window", "gemma2", "phi3", "gpt2"}) {
    SCOPED_TRACE(c);
    const std::string run = out.file("run_" + c);
    const auto r = test::run_cli("train --device cpu --steps 3 --init-from " + folder(c) + " --run-dir " + run +
                                 " --set offload.optimizer=cpu --set data.path=" + out.file("tokens.bin") +
                                 " --set train.seq_len=32 --set train.micro_batch=2 --set train.eval_every=0"
                                 " --set monitor.enabled=false --set train.progress=off");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("offload"), std::string::npos) << r.err;
    const std::string ckpt = run + "/checkpoints/step_00000003";
    auto trained = load_folder(ckpt);
    auto before = load_folder(folder(c));
    const auto ids = ref(c + ".input_ids");
    EXPECT_GT((logits_of(*trained, ids) - logits_of(*before, ids)).abs().max().item<double>(), 1e-4) << "trained";
    ASSERT_EQ(
        run_fixture("forward " + test::shell_quoted(ckpt) + " " + test::shell_quoted(out.file(c + ".safetensors")),
                    out.file(c + ".log")),
        "");
    SafetensorsFile theirs(out.file(c + ".safetensors"));
    EXPECT_LT(relative_error(theirs.tensor("logits"), logits_of(*trained, theirs.tensor("input_ids"))), kRelative);
  }
}

}  // namespace
}  // namespace tandem
