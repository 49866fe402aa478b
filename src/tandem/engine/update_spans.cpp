#include "tandem/engine/update_spans.h"

#include "tandem/core/error.h"
#include "tandem/engine/host_states.h"

namespace tandem {

std::vector<UpdateSpan> block_update_spans(BlockStore& b, const torch::Tensor& grad, const torch::Tensor& out,
                                           const std::vector<GroupHyper>* groups) {
  const bool grad_bf16 = grad.scalar_type() == torch::kBFloat16;
  TANDEM_ASSERT(grad_bf16 || grad.scalar_type() == torch::kFloat32, "gradient dtype ", grad.scalar_type(),
                " (the CPU kernels take fp32 or bf16 gradients)");
  TANDEM_ASSERT(
      grad.numel() >= b.shard_numel && out.numel() >= b.shard_numel && grad.is_contiguous() && out.is_contiguous(),
      "block ", b.name, ": a gradient or output buffer not contiguous or shorter than its slice of ", b.shard_numel);
  const bool bf16_out = out.scalar_type() == torch::kBFloat16;
  const bool state_bf16 = b.m.scalar_type() == torch::kBFloat16, q8 = q8_states(b);
  const int64_t gsize = grad_bf16 ? 2 : 4, ssize = b.m.element_size();
  std::vector<UpdateSpan> spans;
  for (const auto& f : b.shard_params) {
    UpdateSpan s;
    if (bf16_master(b)) {  // Note [bf16 master]
      s.master_bf16 = reinterpret_cast<uint16_t*>(b.master.data_ptr()) + f.offset;
      if (b.master_comp.defined()) s.master_comp = reinterpret_cast<uint16_t*>(b.master_comp.data_ptr()) + f.offset;
    } else {
      s.master = b.master.data_ptr<float>() + f.offset;
    }
    s.grad = static_cast<const char*>(grad.data_ptr()) + f.offset * gsize;
    s.grad_dtype = grad_bf16 ? Dtype::kBF16 : Dtype::kF32;
    s.m = static_cast<char*>(b.m.data_ptr()) + f.offset * ssize;
    s.v = static_cast<char*>(b.v.data_ptr()) + f.offset * ssize;
    s.state_dtype = q8 ? Dtype::kQ8 : (state_bf16 ? Dtype::kBF16 : Dtype::kF32);
    if (q8) {  // Note [8-bit states]: the slice's scales
      s.m_scale = b.m_scale.data_ptr<float>() + f.scale_offset;
      s.v_scale = b.v_scale.data_ptr<float>() + f.scale_offset;
    }
    s.bf16_out = bf16_out ? reinterpret_cast<uint16_t*>(out.data_ptr()) + f.offset : nullptr;
    s.n = f.numel;
    s.index_base = b.index_base + b.shard_offset + f.offset;
    s.weight_decay_scale = f.weight_decay_scale;
    if (groups != nullptr && f.group >= 0) {
      TANDEM_ASSERT(static_cast<size_t>(f.group) < groups->size(), "parameter ", f.name, " of group ", f.group,
                    " beyond the ", groups->size(), " groups set");
      s.group = &(*groups)[static_cast<size_t>(f.group)];
    }
    spans.push_back(s);
  }
  return spans;
}

std::vector<UndoLog> block_undo_logs(BlockStore& b) {
  const int64_t ssize = b.undo_m.element_size();
  std::vector<UndoLog> logs;
  const bool q8 = q8_states(b);
  const bool bf16 = bf16_master(b), comp = b.undo_master_comp.defined();
  const auto u16 = [](const torch::Tensor& t, int64_t offset) {
    return reinterpret_cast<uint16_t*>(t.data_ptr()) + offset;
  };
  for (const auto& f : b.shard_params)
    logs.push_back({bf16 ? nullptr : b.undo_master.data_ptr<float>() + f.offset,
                    static_cast<char*>(b.undo_m.data_ptr()) + f.offset * ssize,
                    static_cast<char*>(b.undo_v.data_ptr()) + f.offset * ssize,
                    q8 ? b.undo_m_scale.data_ptr<float>() + f.scale_offset : nullptr,
                    q8 ? b.undo_v_scale.data_ptr<float>() + f.scale_offset : nullptr,
                    bf16 ? u16(b.undo_master, f.offset) : nullptr, comp ? u16(b.undo_master_comp, f.offset) : nullptr});
  return logs;
}

UpdateHyper update_hyper(UpdateHyper base, double lr, int64_t step, double grad_scale) {
  base.lr = lr;
  base.step = step;
  base.grad_scale = grad_scale;
  base.check_finite = false;
  return base;
}

}  // namespace tandem
