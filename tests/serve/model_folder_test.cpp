// Where generation's weights come from (serve/model_folder.h): a run directory resolves to its
// newest checkpoint, a checkpoint is taken as it is, config.json's eos_token_id is read as a number
// or a list, and a path without a decoder model is refused naming it and the fix.

#include "tandem/serve/model_folder.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../error_of.h"
#include "../test_util.h"
#include "tandem/models/spec.h"
#include "tandem/run/trainer.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

TEST(ModelFolder, ARunDirectoryResolvesToItsNewestCheckpoint) {
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.path(), 2);
  c.train.checkpoint_every = 1;
  const auto run = train(c, {});
  const ModelFolder m = open_model_folder(run.run_dir);
  EXPECT_EQ(fs::path(m.dir).filename(), "step_00000002");
  EXPECT_EQ(m.spec.n_layer, preset_spec("tiny").n_layer);
  EXPECT_EQ(m.spec.d_model, preset_spec("tiny").d_model);
  const ModelFolder same = open_model_folder(m.dir);
  EXPECT_EQ(same.dir, m.dir);
  // eos_token_id as a list (Llama 3's instruct configs) and as a number.
  const std::string config = (fs::path(m.dir) / "config.json").string();
  const auto written = nlohmann::json::parse(test::read_text(config));
  const auto put_eos = [&](const std::string& value) {
    auto j = written;
    j["eos_token_id"] = nlohmann::json::parse(value);
    std::ofstream(config) << j.dump();
    return open_model_folder(m.dir).eos_ids;
  };
  EXPECT_EQ(put_eos("[7, 9]"), (std::vector<TokenId>{7, 9}));
  EXPECT_EQ(put_eos("5"), (std::vector<TokenId>{5}));
  EXPECT_NE(test::error_of([&] { put_eos("\"x\""); }).find("eos_token_id must be a token id"), std::string::npos);
}

TEST(ModelFolder, APathWithoutAModelIsRefusedWithTheFix) {
  test::TempDir dir;
  const std::string missing = test::error_of([&] { open_model_folder(dir.file("nowhere")); });
  EXPECT_NE(missing.find("is not a directory"), std::string::npos) << missing;
  EXPECT_NE(missing.find("Hugging Face model folder"), std::string::npos) << missing;
  EXPECT_FALSE(test::error_of([&] { open_model_folder(dir.path()); }).empty());
}

}  // namespace
}  // namespace tandem
