// A model folder's safetensors (formats/weight_files.h): one file or the shards an index lists,
// tensors found by their HF name (a base model's bare names under the family's prefix), and every
// defect of an index named with its file.

#include "tandem/formats/weight_files.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../error_of.h"
#include "../test_util.h"
#include "tandem/formats/safetensors.h"

namespace tandem {
namespace {

using test::error_of;
using Named = std::vector<std::pair<std::string, torch::Tensor>>;

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// A distinct small tensor per name, so that a tensor read from the wrong entry shows.
torch::Tensor tensor_for(float first) { return torch::arange(first, first + 6.0f).reshape({2, 3}); }

TEST(WeightFiles, AFolderHasWeightsWhenItHoldsTheFileOrTheIndex) {
  test::TempDir empty, single, sharded;
  EXPECT_FALSE(has_weight_files(empty.path()));
  EXPECT_FALSE(has_weight_files(empty.file("no-such-folder")));
  write_safetensors(single.file("model.safetensors"), {{"a", tensor_for(0)}});
  EXPECT_TRUE(has_weight_files(single.path()));
  write_text(sharded.file("model.safetensors.index.json"), R"({"weight_map": {}})");
  EXPECT_TRUE(has_weight_files(sharded.path()));
  write_text(empty.file("pytorch_model.bin"), "not read");
  EXPECT_FALSE(has_weight_files(empty.path()));
}

TEST(WeightFiles, OneFileGivesEachTensorByName) {
  test::TempDir dir;
  write_safetensors(dir.file("model.safetensors"),
                    {{"model.embed_tokens.weight", tensor_for(0)}, {"model.norm.weight", tensor_for(10)}});
  const WeightFiles files(dir.path(), "model.");
  EXPECT_EQ(files.source(), dir.file("model.safetensors"));
  EXPECT_EQ(files.names(), (std::vector<std::string>{"model.embed_tokens.weight", "model.norm.weight"}));
  const auto norm = files.tensor("model.norm.weight");
  ASSERT_TRUE(norm.has_value());
  EXPECT_TRUE(torch::equal(*norm, tensor_for(10)));
  EXPECT_FALSE(files.tensor("model.missing.weight").has_value());
  const TensorLookup lookup = files.lookup();
  ASSERT_TRUE(lookup("model.embed_tokens.weight").has_value());
  EXPECT_TRUE(torch::equal(*lookup("model.embed_tokens.weight"), tensor_for(0)));
  EXPECT_FALSE(lookup("embed_tokens.weight").has_value());
}

// A folder saved from the base model (GPT2Model rather than GPT2LMHeadModel) names its tensors
// without "transformer."; they are found under the prefixed name, as transformers finds them.
TEST(WeightFiles, BareNamesOfABaseModelAreFoundUnderTheFamilysPrefix) {
  test::TempDir dir;
  write_safetensors(dir.file("model.safetensors"), {{"h.0.attn.c_attn.weight", tensor_for(0)},
                                                    {"transformer.wte.weight", tensor_for(10)},
                                                    {"lm_head.weight", tensor_for(20)},
                                                    {"ln_f.weight", tensor_for(30)},
                                                    {"transformer.ln_f.weight", tensor_for(40)}});
  const WeightFiles files(dir.path(), "transformer.");
  EXPECT_EQ(files.names(),
            (std::vector<std::string>{"lm_head.weight", "ln_f.weight", "transformer.h.0.attn.c_attn.weight",
                                      "transformer.ln_f.weight", "transformer.wte.weight"}));
  EXPECT_TRUE(torch::equal(*files.tensor("transformer.h.0.attn.c_attn.weight"), tensor_for(0)));
  EXPECT_FALSE(files.tensor("h.0.attn.c_attn.weight").has_value());
  EXPECT_TRUE(torch::equal(*files.tensor("lm_head.weight"), tensor_for(20)));  // the head is never prefixed
  // A bare name whose prefixed form the file also holds stays as it is: neither hides the other.
  EXPECT_TRUE(torch::equal(*files.tensor("transformer.ln_f.weight"), tensor_for(40)));
  EXPECT_TRUE(torch::equal(*files.tensor("ln_f.weight"), tensor_for(30)));
  // Without a base every name is the file's own.
  const WeightFiles plain(dir.path(), "");
  EXPECT_TRUE(plain.tensor("h.0.attn.c_attn.weight").has_value());
  EXPECT_FALSE(plain.tensor("transformer.h.0.attn.c_attn.weight").has_value());
}

TEST(WeightFiles, AnIndexMapsEachTensorToItsShard) {
  test::TempDir dir;
  write_safetensors(dir.file("model-00001-of-00002.safetensors"),
                    {{"model.a", tensor_for(0)}, {"model.b", tensor_for(10)}});
  write_safetensors(dir.file("model-00002-of-00002.safetensors"), {{"model.c", tensor_for(20)}});
  nlohmann::json index;
  index["metadata"] = {{"total_size", 72}};
  index["weight_map"] = {{"model.a", "model-00001-of-00002.safetensors"},
                         {"model.b", "model-00001-of-00002.safetensors"},
                         {"model.c", "model-00002-of-00002.safetensors"}};
  write_text(dir.file("model.safetensors.index.json"), index.dump());
  {
    const WeightFiles files(dir.path(), "model.");
    EXPECT_EQ(files.source(), dir.file("model.safetensors.index.json"));
    EXPECT_EQ(files.names(), (std::vector<std::string>{"model.a", "model.b", "model.c"}));
    EXPECT_TRUE(torch::equal(*files.tensor("model.b"), tensor_for(10)));
    EXPECT_TRUE(torch::equal(*files.tensor("model.c"), tensor_for(20)));
  }
  // A tensor in a shard that the index does not list is not offered.
  write_safetensors(dir.file("model-00002-of-00002.safetensors"),
                    {{"model.c", tensor_for(20)}, {"model.d", tensor_for(30)}});
  EXPECT_FALSE(WeightFiles(dir.path(), "model.").tensor("model.d").has_value());
  // model.safetensors, when present, is read instead of the index.
  write_safetensors(dir.file("model.safetensors"), {{"model.z", tensor_for(50)}});
  const WeightFiles single(dir.path(), "model.");
  EXPECT_EQ(single.source(), dir.file("model.safetensors"));
  EXPECT_EQ(single.names(), (std::vector<std::string>{"model.z"}));
}

TEST(WeightFiles, EveryDefectOfTheFolderOrItsIndexIsNamed) {
  test::TempDir dir;
  const auto refusal = [&](const std::string& index_text) {
    write_text(dir.file("model.safetensors.index.json"), index_text);
    return error_of([&] { WeightFiles(dir.path(), "model."); });
  };
  const std::string none = error_of([&] { WeightFiles(dir.path(), "model."); });
  EXPECT_NE(none.find("no model.safetensors or model.safetensors.index.json in '" + dir.path() + "'"),
            std::string::npos)
      << none;
  write_safetensors(dir.file("shard.safetensors"), {{"model.a", tensor_for(0)}});
  const std::string index = dir.file("model.safetensors.index.json");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"weight_map": )", index + ": not valid JSON"},
      {R"({"metadata": {}})", index + ": missing the 'weight_map' object"},
      {R"({"weight_map": ["shard.safetensors"]})", index + ": missing the 'weight_map' object"},
      {R"({"weight_map": {"model.a": 3}})", "weight_map entry 'model.a' is not a file name"},
      {R"({"weight_map": {"model.a": "sub/shard.safetensors"}})",
       "shard name 'sub/shard.safetensors' must be a plain file name"},
      {R"({"weight_map": {"model.a": ""}})", "shard name '' must be a plain file name"},
      {R"({"weight_map": {"model.a": ".."}})", "shard name '..' must be a plain file name"},
      {R"({"weight_map": {"model.a": "."}})", "is not a regular file"},  // the folder itself
      {R"({"weight_map": {"model.a": "gone.safetensors"}})", "lists shard 'gone.safetensors' which is missing from"},
      {R"({"weight_map": {"model.a": "shard.safetensors", "model.b": "shard.safetensors"}})",
       "does not hold tensor 'model.b'"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string message = refusal(text);
    EXPECT_NE(message.find(expected), std::string::npos) << text << "\n" << message;
  }
  // And a well-formed index of the same shard is read.
  EXPECT_EQ(refusal(R"({"weight_map": {"model.a": "shard.safetensors"}})"), "");
}

}  // namespace
}  // namespace tandem
