#include "tandem/optim/cpu_optimizer.h"

#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"

namespace tandem {

namespace {

bool keeps_m(const UpdateHyper& h) { return h.rule != UpdateRule::kSgd || h.beta1 != 0.0; }
bool keeps_v(const UpdateHyper& h) { return h.rule == UpdateRule::kAdamW || h.rule == UpdateRule::kAdam; }
const char* m_name(const UpdateHyper& h) { return h.rule == UpdateRule::kSgd ? ".momentum_buffer" : ".exp_avg"; }

}  // namespace

CpuOptimizer::CpuOptimizer(std::vector<NamedTensor> params, CpuOptimizerOptions options) : options_(options) {
  const auto sopts =
      torch::TensorOptions().dtype(options.state_dtype == Dtype::kF32 ? torch::kFloat32 : torch::kBFloat16);
  int64_t base = 0;
  for (auto& [name, p] : params) {
    TANDEM_CHECK(p.device().is_cpu() && p.scalar_type() == torch::kFloat32 && p.is_contiguous(),
                 "the CPU optimizer needs contiguous fp32 CPU parameters; '", name, "' is ", p.scalar_type(), " on ",
                 p.device(), "; use optim.impl=fused for parameters on a GPU");
    Entry e{name, p, {}, {}, p.dim() >= 2 || options.decay_1d ? 1.0f : 0.0f, base};
    if (keeps_m(options.hyper)) e.m = torch::zeros({p.numel()}, sopts);
    if (keeps_v(options.hyper)) e.v = torch::zeros({p.numel()}, sopts);
    base += p.numel();
    entries_.push_back(std::move(e));
  }
  step_ = torch::zeros({}, torch::kFloat32);
}

void CpuOptimizer::step(double lr, const std::optional<torch::Tensor>& found_inf) {
  if (found_inf && found_inf->defined() && found_inf->item<float>() != 0.0f) return;  // skipped step
  torch::NoGradGuard no_grad;
  UpdateHyper h = options_.hyper;
  h.lr = lr;
  h.step = static_cast<int64_t>(step_.item<float>()) + 1;
  std::vector<UpdateSpan> spans;
  std::vector<torch::Tensor> keep;  // gradients converted or created for this step
  spans.reserve(entries_.size());
  for (auto& e : entries_) {
    torch::Tensor g = e.param.grad();
    if (!g.defined()) g = torch::zeros_like(e.param);  // an unused parameter still decays
    if (g.scalar_type() != torch::kFloat32 && g.scalar_type() != torch::kBFloat16) g = g.to(torch::kFloat32);
    g = g.contiguous();
    TANDEM_ASSERT(g.device().is_cpu(), "gradient of ", e.name, " is on ", g.device());
    keep.push_back(g);
    UpdateSpan s;
    s.master = e.param.data_ptr<float>();
    s.grad = g.data_ptr();
    s.grad_dtype = g.scalar_type() == torch::kBFloat16 ? Dtype::kBF16 : Dtype::kF32;
    s.m = e.m.defined() ? e.m.data_ptr() : nullptr;
    s.v = e.v.defined() ? e.v.data_ptr() : nullptr;
    s.state_dtype = options_.state_dtype;
    s.n = e.param.numel();
    s.index_base = e.index_base;
    s.weight_decay_scale = e.weight_decay_scale;
    spans.push_back(s);
  }
  const UpdateReport report = cpu_update(spans, h, nullptr, options_.pool);
  if (!report.ok())
    log::warn(
        strprintf("CPU optimizer: %lld non-finite gradient elements (first at %lld); their %lld tiles were "
                  "not updated",
                  static_cast<long long>(report.nonfinite), static_cast<long long>(report.first_nonfinite),
                  static_cast<long long>(report.skipped_tiles)));
  step_.fill_(static_cast<double>(h.step));
}

void CpuOptimizer::zero_grad() {
  for (auto& e : entries_) e.param.mutable_grad() = torch::Tensor();
}

std::vector<NamedTensor> CpuOptimizer::state() {
  std::vector<NamedTensor> out;
  for (auto& e : entries_) {
    if (e.m.defined()) out.emplace_back(e.name + m_name(options_.hyper), e.m.view(e.param.sizes()));
    if (e.v.defined()) out.emplace_back(e.name + ".exp_avg_sq", e.v.view(e.param.sizes()));
    out.emplace_back(e.name + ".step", step_);
  }
  return out;
}

}  // namespace tandem
