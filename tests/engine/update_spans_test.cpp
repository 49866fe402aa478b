// The CPU kernel's view of a Block: one span per parameter piece at the right addresses, dtypes
// and element indices; undo logs beside them; and the coefficients of one update.

#include "tandem/engine/update_spans.h"

#include <gtest/gtest.h>

#include "engine_fixtures.h"
#include <torch/torch.h>

#include "tandem/core/error.h"
#include "tandem/models/model.h"
#include "tandem/models/spec.h"

namespace tandem {
namespace {

ModelSpec small_spec() { return test::small_engine_spec(2); }

const char* at(const torch::Tensor& t, int64_t elements) {
  return static_cast<const char*>(t.data_ptr()) + elements * t.element_size();
}

TEST(UpdateSpans, OneSpanPerParameterAtItsOffsetWithTheBuffersDtypes) {
  for (const auto state : {torch::kFloat32, torch::kBFloat16}) {
    torch::manual_seed(7);
    auto model = build_model(small_spec(), false);
    ParamStoreOptions so;
    so.compute_dtype = torch::kBFloat16;
    so.host_state_dtype = state;
    ParamStore store(*model, so, 0);
    auto& b = store.blocks()[1];
    const auto grad = torch::zeros({b.shard_numel}, torch::kFloat32);
    for (const auto& out : {b.staging, b.master}) {  // bf16: the new weights written; fp32: not
      const auto spans = block_update_spans(b, grad, out);
      ASSERT_EQ(spans.size(), b.shard_params.size());
      for (size_t k = 0; k < spans.size(); ++k) {
        const auto& s = spans[k];
        const auto& f = b.shard_params[k];
        SCOPED_TRACE(f.name);
        EXPECT_EQ(s.n, f.numel);
        EXPECT_EQ(reinterpret_cast<const char*>(s.master), at(b.master, f.offset));
        EXPECT_EQ(static_cast<const char*>(s.grad), at(grad, f.offset));
        EXPECT_EQ(s.grad_dtype, Dtype::kF32);
        EXPECT_EQ(static_cast<const char*>(s.m), at(b.m, f.offset));
        EXPECT_EQ(static_cast<const char*>(s.v), at(b.v, f.offset));
        EXPECT_EQ(s.state_dtype, state == torch::kBFloat16 ? Dtype::kBF16 : Dtype::kF32);
        if (out.scalar_type() == torch::kBFloat16)
          EXPECT_EQ(reinterpret_cast<const char*>(s.bf16_out), at(out, f.offset));
        else
          EXPECT_EQ(s.bf16_out, nullptr);
        EXPECT_EQ(s.index_base, b.index_base + f.offset);  // element indices in the whole model
        EXPECT_EQ(s.weight_decay_scale, f.weight_decay_scale);
      }
    }
    // Undo logs: the same offsets in the undo buffers, in the states' dtype.
    const auto logs = block_undo_logs(b);
    ASSERT_EQ(logs.size(), b.shard_params.size());
    for (size_t k = 0; k < logs.size(); ++k) {
      const auto& f = b.shard_params[k];
      EXPECT_EQ(reinterpret_cast<const char*>(logs[k].master), at(b.undo_master, f.offset));
      EXPECT_EQ(static_cast<const char*>(logs[k].m), at(b.undo_m, f.offset));
      EXPECT_EQ(static_cast<const char*>(logs[k].v), at(b.undo_v, f.offset));
    }
  }
}

TEST(UpdateSpans, ABf16GradientIsReadAsBf16AndOtherDtypesAreRefused) {
  torch::manual_seed(7);
  auto model = build_model(small_spec(), false);
  ParamStore store(*model, {}, 0);
  auto& b = store.blocks()[2];
  const auto bf16 = torch::zeros({b.shard_numel}, torch::kBFloat16);
  const auto spans = block_update_spans(b, bf16, b.staging);
  ASSERT_FALSE(spans.empty());
  EXPECT_EQ(spans.back().grad_dtype, Dtype::kBF16);
  EXPECT_EQ(static_cast<const char*>(spans.back().grad), at(bf16, b.shard_params.back().offset));
  EXPECT_THROW(block_update_spans(b, bf16.to(torch::kHalf), b.staging), InternalError);
  EXPECT_THROW(block_update_spans(b, bf16.narrow(0, 0, b.shard_numel - 1), b.staging), InternalError);
}

TEST(UpdateSpans, AnUpdatesCoefficientsKeepTheBaseAndLeaveTheNormToTheEngine) {
  UpdateHyper base;
  base.rule = UpdateRule::kAdam;
  base.beta1 = 0.8;
  base.beta2 = 0.9;
  base.eps = 1e-6;
  base.weight_decay = 0.05;
  base.rounding = Rounding::kStochastic;
  const UpdateHyper h = update_hyper(base, 3e-4, 17, 0.25);
  EXPECT_EQ(h.rule, UpdateRule::kAdam);
  EXPECT_EQ(h.beta1, 0.8);
  EXPECT_EQ(h.beta2, 0.9);
  EXPECT_EQ(h.eps, 1e-6);
  EXPECT_EQ(h.weight_decay, 0.05);
  EXPECT_EQ(h.rounding, Rounding::kStochastic);
  EXPECT_EQ(h.lr, 3e-4);
  EXPECT_EQ(h.step, 17);
  EXPECT_EQ(h.grad_scale, 0.25);
  EXPECT_FALSE(h.check_finite);
  EXPECT_TRUE(base.check_finite);  // the base is not changed
}

}  // namespace
}  // namespace tandem
