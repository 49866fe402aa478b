// Note [Every tensor used] (formats/tensor_use.h): the names a load asks for are recorded through
// the lookup, and a file holding tensors nobody asked for is refused by name, old transformers
// buffers excepted.

#include "tandem/formats/tensor_use.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "../error_of.h"
#include "../test_util.h"

namespace tandem {
namespace {

using test::error_of;

// A lookup over a fixed table of small tensors; counts the calls.
TensorLookup table_lookup(std::map<std::string, torch::Tensor> table, int* calls) {
  return [table = std::move(table), calls](const std::string& name) -> std::optional<torch::Tensor> {
    ++*calls;
    const auto it = table.find(name);
    if (it == table.end()) return std::nullopt;
    return it->second;
  };
}

TEST(TensorUse, EveryNameAskedForCountsAndTheLookupPassesItsAnswerThrough) {
  const TensorUse use({"a.weight", "b.weight"}, "ckpt/model.safetensors");
  int calls = 0;
  const TensorLookup lookup = use.recording(table_lookup({{"a.weight", torch::full({2}, 3.0)}}, &calls));
  EXPECT_NE(error_of([&] { use.check_all_used(); }), "");  // nothing asked for yet
  const auto a = lookup("a.weight");
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(torch::equal(*a, torch::full({2}, 3.0)));
  EXPECT_FALSE(lookup("absent.weight").has_value());
  EXPECT_EQ(calls, 2);
  EXPECT_NE(error_of([&] { use.check_all_used(); }).find("(b.weight)"), std::string::npos);
  // A name asked for counts even when the lookup had no tensor for it (a missing tensor is the
  // loader's error, not this one's).
  EXPECT_FALSE(lookup("b.weight").has_value());
  EXPECT_EQ(error_of([&] { use.check_all_used(); }), "");
}

TEST(TensorUse, MarkUsedCountsATensorReadThroughAnother) {
  const TensorUse use({"model.embed_tokens.weight", "lm_head.weight"}, "folder");
  int calls = 0;
  const TensorLookup lookup = use.recording(table_lookup({}, &calls));
  lookup("model.embed_tokens.weight");
  EXPECT_NE(error_of([&] { use.check_all_used(); }).find("lm_head.weight"), std::string::npos);
  use.mark_used("lm_head.weight");  // tied: the head is the embedding
  EXPECT_EQ(error_of([&] { use.check_all_used(); }), "");
}

TEST(TensorUse, TheRefusalNamesTheSourceTheCountAndTheFirstFour) {
  const std::vector<std::string> names = {"used", "x.5", "x.1", "x.4", "x.2", "x.3"};
  const TensorUse use(names, "run/checkpoints/step_00000002/model.safetensors");
  int calls = 0;
  use.recording(table_lookup({}, &calls))("used");
  const std::string message = error_of([&] { use.check_all_used(); });
  EXPECT_EQ(message.rfind("run/checkpoints/step_00000002/model.safetensors holds 5 tensor(s) the model does not use "
                          "(x.5, x.1, x.4, x.2, ...)",
                          0),
            0u)
      << message;  // in the file's order, the fifth left out
  EXPECT_EQ(message.find("x.3"), std::string::npos) << message;
  EXPECT_NE(message.find("another architecture"), std::string::npos) << message;
  // Four or fewer: all named, no ellipsis.
  const TensorUse few({"p", "q"}, "f");
  const std::string two = error_of([&] { few.check_all_used(); });
  EXPECT_EQ(two.rfind("f holds 2 tensor(s) the model does not use (p, q):", 0), 0u) << two;
}

TEST(TensorUse, BuffersOldTransformersWroteDoNotCount) {
  const TensorUse benign(
      {"model.layers.0.self_attn.rotary_emb.inv_freq", "transformer.h.0.attn.bias", "transformer.h.3.attn.masked_bias"},
      "gpt2");
  EXPECT_EQ(error_of([&] { benign.check_all_used(); }), "");
  // Only as whole name parts: a bias of a module whose name merely ends in "attn" is a real tensor.
  const TensorUse real({"model.layers.0.self_attn.bias", "model.layers.0.cross_attn.masked_bias2"}, "folder");
  const std::string message = error_of([&] { real.check_all_used(); });
  EXPECT_NE(message.find("holds 2 tensor(s)"), std::string::npos) << message;
  EXPECT_NE(message.find("model.layers.0.self_attn.bias"), std::string::npos) << message;
}

}  // namespace
}  // namespace tandem
