#include "tandem/engine/host_states.h"

#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"
#include "tandem/engine/param_store.h"
#include "tandem/optim/q8_codes.h"

namespace tandem {

bool q8_states(const BlockStore& b) { return b.m.defined() && b.m.scalar_type() == torch::kInt8; }

namespace {

// Scale offsets of the parameters' slices, in order; returns the Block's scale count.
int64_t layout_scales(BlockStore& b) {
  int64_t n = 0;
  for (auto& f : b.shard_params) {
    f.scale_offset = n;
    n += q8::scale_count(f.numel);
  }
  return n;
}

}  // namespace

void allocate_host_states(BlockStore& b, torch::ScalarType dtype,
                          const std::function<torch::Tensor(int64_t, torch::ScalarType)>& alloc) {
  if (dtype != torch::kInt8) {
    b.m = alloc(b.shard_numel, dtype);
    b.v = alloc(b.shard_numel, dtype);
    b.m_scale = b.v_scale = torch::Tensor();
    return;
  }
  const int64_t scales = layout_scales(b);
  b.m = alloc(b.shard_numel, torch::kInt8);
  b.v = alloc(b.shard_numel, torch::kUInt8);
  b.m_scale = alloc(scales, torch::kFloat32);
  b.v_scale = alloc(scales, torch::kFloat32);
}

void allocate_undo_states(BlockStore& b) {
  // As the master: fp32, or bf16 (Note [bf16 master]).
  b.undo_master = torch::empty({b.shard_numel}, b.master.defined() ? b.master.scalar_type() : torch::kFloat32);
  if (b.master_comp.defined()) b.undo_master_comp = torch::empty({b.shard_numel}, torch::kBFloat16);
  b.undo_m = torch::empty({b.shard_numel}, b.m.scalar_type());
  b.undo_v = torch::empty({b.shard_numel}, b.v.scalar_type());
  if (q8_states(b)) {
    b.undo_m_scale = torch::empty_like(b.m_scale);
    b.undo_v_scale = torch::empty_like(b.v_scale);
  }
}

std::pair<torch::Tensor, torch::Tensor> param_states_f32(const BlockStore& b, size_t k) {
  const FlatParam& f = b.shard_params.at(k);
  if (!q8_states(b))
    return {b.m.narrow(0, f.offset, f.numel).to(torch::kFloat32), b.v.narrow(0, f.offset, f.numel).to(torch::kFloat32)};
  auto m = torch::empty({f.numel}), v = torch::empty({f.numel});
  q8::decode(b.m.data_ptr<int8_t>() + f.offset, b.v.data_ptr<uint8_t>() + f.offset,
             b.m_scale.data_ptr<float>() + f.scale_offset, b.v_scale.data_ptr<float>() + f.scale_offset, f.numel,
             m.data_ptr<float>(), v.data_ptr<float>());
  return {m, v};
}

void set_param_states(BlockStore& b, size_t k, const torch::Tensor& m, const torch::Tensor& v) {
  const FlatParam& f = b.shard_params.at(k);
  TANDEM_ASSERT(m.numel() == f.numel && v.numel() == f.numel, "block ", b.name, ": states of ", m.numel(),
                " elements for ", f.name, "'s ", f.numel);
  torch::NoGradGuard no_grad;
  if (!q8_states(b)) {
    b.m.narrow(0, f.offset, f.numel).copy_(m.reshape(-1));
    b.v.narrow(0, f.offset, f.numel).copy_(v.reshape(-1));
    return;
  }
  const auto m32 = m.to(torch::kCPU, torch::kFloat32).contiguous(),
             v32 = v.to(torch::kCPU, torch::kFloat32).contiguous();
  q8::encode(m32.data_ptr<float>(), v32.data_ptr<float>(), f.numel, b.m.data_ptr<int8_t>() + f.offset,
             b.v.data_ptr<uint8_t>() + f.offset, b.m_scale.data_ptr<float>() + f.scale_offset,
             b.v_scale.data_ptr<float>() + f.scale_offset);
}

std::pair<torch::Tensor, torch::Tensor> states_f32(const BlockStore& b) {
  if (!q8_states(b)) {
    if (b.m.scalar_type() == torch::kFloat32) return {b.m, b.v};
    return {b.m.to(torch::kFloat32), b.v.to(torch::kFloat32)};
  }
  auto m = torch::zeros({b.shard_numel}), v = torch::zeros({b.shard_numel});
  CpuThreadPool::global().run(static_cast<int64_t>(b.shard_params.size()), [&](int64_t k) {
    const FlatParam& f = b.shard_params[static_cast<size_t>(k)];
    auto [pm, pv] = param_states_f32(b, static_cast<size_t>(k));
    m.narrow(0, f.offset, f.numel).copy_(pm);
    v.narrow(0, f.offset, f.numel).copy_(pv);
  });
  return {m, v};
}

void set_states(BlockStore& b, const torch::Tensor& m, const torch::Tensor& v) {
  TANDEM_ASSERT(m.numel() == b.shard_numel && v.numel() == b.shard_numel, "block ", b.name, ": states of ", m.numel(),
                " elements for a slice of ", b.shard_numel);
  torch::NoGradGuard no_grad;
  if (!q8_states(b)) {
    b.m.copy_(m.reshape(-1));
    b.v.copy_(v.reshape(-1));
    return;
  }
  const auto m32 = m.to(torch::kCPU, torch::kFloat32).contiguous(),
             v32 = v.to(torch::kCPU, torch::kFloat32).contiguous();
  CpuThreadPool::global().run(static_cast<int64_t>(b.shard_params.size()), [&](int64_t k) {
    const FlatParam& f = b.shard_params[static_cast<size_t>(k)];
    set_param_states(b, static_cast<size_t>(k), m32.narrow(0, f.offset, f.numel), v32.narrow(0, f.offset, f.numel));
  });
}

}  // namespace tandem
