#pragma once
// What the tests of the SIMD update kernels share (tests/optim/cpu_update_avx2_test.cpp and
// cpu_update_avx512_test.cpp): one span's buffers at an offset, their bit-for-bit comparison, the
// hyperparameters of every rule, and guards for the kernel level and LibTorch's threads.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <string>

#include "tandem/optim/cpu_update.h"

namespace tandem::test {

// Puts the process's kernel level back at scope exit.
class IsaGuard {
 public:
  IsaGuard() : prev_(active_cpu_isa()) {}
  ~IsaGuard() { set_cpu_isa(prev_); }

 private:
  CpuIsa prev_;
};

// LibTorch on one thread for the scope: the tests make hundreds of small buffers, and on two busy
// cores OpenMP's waiting threads cost far more than the work.
class OneTorchThread {
 public:
  OneTorchThread() : prev_(at::get_num_threads()) { at::set_num_threads(1); }
  ~OneTorchThread() { at::set_num_threads(prev_); }

 private:
  int prev_;
};

inline torch::ScalarType torch_type(Dtype d) { return d == Dtype::kF32 ? torch::kFloat32 : torch::kBFloat16; }

// One span's buffers, used from element `offset` of each allocation: offset 0 leaves the bf16
// copy 64-byte aligned (the kernels stream it), any other offset misaligns every buffer.
struct Buffers {
  torch::Tensor master, grad, m, v, out;
  int64_t n, offset;
  Dtype gd, sd;
  bool with_out = true;  ///< false: the span writes no bf16 copy

  Buffers(int64_t n_, int64_t offset_, Dtype g, Dtype s, uint64_t seed) : n(n_), offset(offset_), gd(g), sd(s) {
    torch::manual_seed(seed);
    master = torch::randn({n + offset});
    grad = (torch::randn({n + offset}) * 1e-2).to(torch_type(g));
    m = (torch::randn({n + offset}) * 1e-3).to(torch_type(s));
    v = (torch::rand({n + offset}) * 1e-4).to(torch_type(s));
    out = torch::zeros({n + offset}, torch::kBFloat16);
  }
  Buffers clone() const {
    Buffers b = *this;
    b.master = master.clone(), b.grad = grad.clone(), b.m = m.clone(), b.v = v.clone(), b.out = out.clone();
    return b;
  }
  /// Elements [begin, begin + count) of the buffers as a span (count -1: to the end).
  UpdateSpan span(int64_t index_base = 0, int64_t begin = 0, int64_t count = -1) const {
    UpdateSpan s;
    const int64_t o = offset + begin;
    s.n = count < 0 ? n - begin : count;
    s.index_base = index_base;
    s.master = master.data_ptr<float>() + o;
    s.grad = static_cast<char*>(grad.data_ptr()) + o * grad.element_size();
    s.m = static_cast<char*>(m.data_ptr()) + o * m.element_size();
    s.v = static_cast<char*>(v.data_ptr()) + o * v.element_size();
    s.bf16_out = with_out ? reinterpret_cast<uint16_t*>(out.data_ptr()) + o : nullptr;
    s.grad_dtype = gd;
    s.state_dtype = sd;
    s.weight_decay_scale = 0.5f;
    return s;
  }
  void set_grad(int64_t i, float x) { grad[offset + i] = x; }
};

// "" when every buffer agrees bit for bit, else the first difference.
inline std::string first_difference(const Buffers& a, const Buffers& b) {
  const char* names[] = {"master", "m", "v", "bf16 copy"};
  const torch::Tensor xs[] = {a.master, a.m, a.v, a.out}, ys[] = {b.master, b.m, b.v, b.out};
  for (int k = 0; k < 4; ++k) {
    const int64_t bytes = xs[k].numel() * xs[k].element_size();
    if (std::memcmp(xs[k].data_ptr(), ys[k].data_ptr(), bytes) == 0) continue;
    const auto int_type = xs[k].element_size() == 4 ? torch::kInt32 : torch::kInt16;
    const auto ne = (xs[k].view(int_type) != ys[k].view(int_type)).nonzero();
    const int64_t i = ne[0][0].item<int64_t>();
    return std::string(names[k]) + " differs first at element " + std::to_string(i - a.offset) + ": " +
           std::to_string(xs[k][i].item<double>()) + " vs " + std::to_string(ys[k][i].item<double>()) + " (" +
           std::to_string(ne.size(0)) + " elements differ)";
  }
  return "";
}

inline UpdateHyper hyper_for(UpdateRule rule, Rounding rounding, int64_t step, uint64_t seed) {
  UpdateHyper h;
  h.rule = rule;
  h.lr = 1e-2;
  h.beta1 = 0.9;
  h.beta2 = rule == UpdateRule::kLion ? 0.99 : 0.95;
  h.weight_decay = 0.1;
  h.dampening = rule == UpdateRule::kSgd ? 0.1 : 0.0;
  h.step = step;
  h.grad_scale = 0.75;
  h.rounding = rounding;
  h.seed = seed;
  return h;
}

inline std::string report_text(const UpdateReport& r) {
  return "nonfinite " + std::to_string(r.nonfinite) + ", first " + std::to_string(r.first_nonfinite) +
         ", skipped tiles " + std::to_string(r.skipped_tiles);
}

}  // namespace tandem::test
