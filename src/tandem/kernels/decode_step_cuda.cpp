// The persistent decode step for CUDA tensors: the model's checks and its table of layers on the
// device, each step's scratch in LibTorch, the kernel in decode_step.cu on the current stream (Note
// [Persistent decode step]). Registered at load time.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"
#include "tandem/kernels/cuda_check.h"
#include "tandem/kernels/decode_step.h"
#include "tandem/kernels/decode_step_launch.h"
#include "tandem/kernels/device_facts.h"
#include "tandem/kernels/element_type_of.h"
#include "tandem/kernels/paged_attention_launch.h"

namespace tandem::detail {
namespace {

// Note [Persistent step trace]
// TANDEM_DECODE_STEP_TRACE=FILE has every eager step (not those recorded into CUDA graphs: `tandem
// generate --eager`) record each block's clock as each part of the step ends (DecodeStepArgs::trace;
// the consumers meet before each mark, so the step runs a little slower), and writes into FILE, when
// the step goes, each part's mean time a layer over the blocks, the layers and the steps: where the
// step's time goes, part by part. A diagnostic; off unless set.
class StepTrace {
 public:
  explicit StepTrace(std::string path) : path_(std::move(path)) {}
  ~StepTrace() { write(); }
  bool on() const { return !path_.empty(); }
  // Adds one step's marks (blocks, marks) of n_layer layers.
  void add(const torch::Tensor& marks, int64_t n_layer) {
    const auto t = marks.cpu();
    const int64_t blocks = t.size(0), per = t.size(1), last = n_layer * kDecodeStepLayerMarks;
    const auto* v = t.data_ptr<int64_t>();
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t* m = v + b * per;
      for (int64_t i = 0; i < last; ++i) {
        const int64_t next = i + 1 < last ? m[i + 1] : m[last];
        parts_[static_cast<size_t>(i % kDecodeStepLayerMarks)] += double(next - m[i]) / double(blocks * n_layer);
      }
      final_[0] += double(m[last + 1] - m[last]) / double(blocks);
      final_[1] += double(m[last + 2] - m[last + 1]) / double(blocks);
      total_ += double(m[last + 2] - m[0]) / double(blocks);
    }
    ++steps_;
  }

 private:
  void write() const {
    if (steps_ == 0) return;
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    const double us = 1e-3 * std::max(1, khz);  // cycles a microsecond
    static const char* names[kDecodeStepLayerMarks] = {
        "attention norm", "q/k/v (RoPE, cache)", "barrier",        "attention", "barrier", "rows in", "o",
        "barrier",        "feed-forward norm",   "gate/up (silu)", "barrier",   "rows in", "down",    "barrier"};
    std::FILE* f = std::fopen(path_.c_str(), "w");
    if (f == nullptr) return;
    std::fprintf(f, "part, us a layer (mean of %lld steps and every block)\n", static_cast<long long>(steps_));
    for (int i = 0; i < kDecodeStepLayerMarks; ++i) std::fprintf(f, "%s, %.3f\n", names[i], parts_[i] / steps_ / us);
    std::fprintf(f, "final norm (once), %.3f\nlogits (once), %.3f\nstep, %.3f\n", final_[0] / steps_ / us,
                 final_[1] / steps_ / us, total_ / steps_ / us);
    std::fclose(f);
  }
  std::string path_;
  std::array<double, kDecodeStepLayerMarks> parts_{};
  std::array<double, 2> final_{};
  double total_ = 0;
  int64_t steps_ = 0;
};

bool aligned(const torch::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// Why a tensor of the model does not suit the step ("" when it does): on `device`, contiguous and
// 16-byte aligned, of `dtype`, `numel` elements (undefined is allowed where `optional`).
std::string tensor_refusal(const char* what, const torch::Tensor& t, const c10::Device& device, torch::ScalarType dtype,
                           int64_t numel, bool optional = false) {
  if (!t.defined()) return optional ? "" : strprintf("no %s", what);
  if (t.device() != device || t.scalar_type() != dtype || !t.is_contiguous() || !aligned(t) || t.numel() != numel)
    return strprintf("its %s (%s %s, %lld elements; %lld expected)", what, t.toString().c_str(),
                     t.is_contiguous() ? "contiguous" : "strided", static_cast<long long>(t.numel()),
                     static_cast<long long>(numel));
  return "";
}

const void* pointer(const torch::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

class CudaDecodeStep final : public DecodeStep {
 public:
  CudaDecodeStep(const DecodeStepModel& model, DecodeStepDims dims, std::array<DecodeStepPlan, 4> plans,
                 std::array<bool, 4> takes)
      : model_(model), dims_(dims), plans_(plans), takes_(takes), trace_(trace_path()) {
    const auto device = model.embed.device();
    std::vector<DecodeStepLayer> table;
    for (const auto& l : model.layers) {
      DecodeStepLayer e;
      e.qkv = l.qkv.data_ptr(), e.qkv_bias = pointer(l.qkv_bias);
      e.o = l.o.data_ptr(), e.o_bias = pointer(l.o_bias);
      e.gate_up = l.gate_up.data_ptr(), e.gate_up_bias = pointer(l.gate_up_bias);
      e.down = l.down.data_ptr(), e.down_bias = pointer(l.down_bias);
      e.attn_norm = l.attn_norm.data_ptr<float>(), e.ff_norm = l.ff_norm.data_ptr<float>();
      e.k_cache = l.k_cache.data_ptr(), e.v_cache = l.v_cache.data_ptr();
      e.window = l.window;
      table.push_back(e);
    }
    const auto bytes = static_cast<int64_t>(table.size() * sizeof(DecodeStepLayer));
    auto host = torch::empty({bytes}, torch::kUInt8);
    std::memcpy(host.data_ptr(), table.data(), static_cast<size_t>(bytes));
    table_ = host.to(device);
    DecodeStepDims most = dims_;
    most.rows = DecodeStep::kMaxRows;
    sync_ = torch::zeros({decode_step_sync_words(most)}, torch::TensorOptions().dtype(torch::kInt32).device(device));
    element_type_of(model.lm_head.scalar_type(), &elem_);
  }

  bool takes(int64_t rows) const override { return rows >= 1 && rows <= kMaxRows && takes_[rows - 1]; }

  torch::Tensor run(const DecodeStepInputs& in) override {
    const int64_t rows = in.tokens.size(0);
    TANDEM_ASSERT(takes(rows), "the persistent decode step given ", rows, " rows");
    const c10::cuda::CUDAGuard guard(model_.embed.device());
    for (const auto* t : {&in.tokens, &in.positions, &in.write_page, &in.write_slot, &in.lengths, &in.pages})
      TANDEM_ASSERT(t->scalar_type() == torch::kInt64 && t->is_contiguous() && t->size(0) == rows,
                    "the persistent decode step's inputs: int64, contiguous, one row a sequence");
    DecodeStepArgs a;
    a.dims = dims_;
    a.dims.rows = rows;
    a.plan = plans_[static_cast<size_t>(rows - 1)];
    a.elem = elem_;
    a.layers = static_cast<const DecodeStepLayer*>(table_.data_ptr());
    a.embed = model_.embed.data_ptr();
    a.final_norm = model_.final_norm.data_ptr<float>();
    a.lm_head = model_.lm_head.data_ptr();
    a.cos = model_.cos.data_ptr();
    a.sin = model_.sin.data_ptr();
    a.tokens = in.tokens.data_ptr<int64_t>();
    a.positions = in.positions.data_ptr<int64_t>();
    a.write_page = in.write_page.data_ptr<int64_t>();
    a.write_slot = in.write_slot.data_ptr<int64_t>();
    a.lengths = in.lengths.data_ptr<int64_t>();
    a.pages = in.pages.data_ptr<int64_t>();
    a.pages_stride = in.pages.size(1);
    // The paged kernel's splits for these tables (paged_attention_cuda.cpp), with and without a window.
    const int sms = multiprocessor_count();
    int most = 1;
    for (const int w : {0, 1}) {
      int64_t keys = a.pages_stride * dims_.page_tokens;
      if (w == 1) keys = std::min(keys, max_window_ > 0 ? max_window_ : keys);
      a.splits[w] = paged_decode_splits(rows, dims_.KV, keys, sms, &a.split_keys[w]);
      most = std::max(most, a.splits[w]);
    }
    const auto& d = a.dims;
    const int64_t eb = d.elem_bytes;
    const int64_t sizes[] = {2 * rows * d.C * 4,
                             rows * d.C * eb,
                             rows * d.C * eb,
                             rows * d.H * d.hd * eb,
                             rows * d.H * d.hd * eb,
                             rows * d.F * eb,
                             rows * d.H * most * (d.hd + 2) * 4};
    int64_t total = 0;
    for (const int64_t s : sizes) total += (s + 255) / 256 * 256;
    auto scratch = torch::empty({total}, model_.embed.options().dtype(torch::kUInt8));
    auto* base = static_cast<unsigned char*>(scratch.data_ptr());
    void* part[7];
    for (int i = 0; i < 7; ++i) part[i] = base, base += (sizes[i] + 255) / 256 * 256;
    a.stream = static_cast<float*>(part[0]);
    a.ff_out = part[1], a.attn_proj = part[2], a.q = part[3], a.attn = part[4], a.inner = part[5];
    a.partial = static_cast<float*>(part[6]);
    a.sync = reinterpret_cast<unsigned*>(sync_.data_ptr<int32_t>());
    auto logits = torch::empty({rows, d.V}, model_.embed.options().dtype(torch::kFloat32));
    a.logits = logits.data_ptr<float>();
    const auto stream = c10::cuda::getCurrentCUDAStream();
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    TANDEM_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    torch::Tensor marks;  // Note [Persistent step trace]
    if (trace_.on() && capture == cudaStreamCaptureStatusNone) {
      marks = torch::zeros({a.plan.blocks, decode_step_marks(d)}, model_.embed.options().dtype(torch::kInt64));
      a.trace = reinterpret_cast<long long*>(marks.data_ptr<int64_t>());
    }
    launch_decode_step(a, stream);
    if (marks.defined()) trace_.add(marks, d.n_layer);
    return logits;  // the scratch goes back to the stream's allocator, reused only after this launch
  }

  void set_max_window(int64_t w) { max_window_ = w; }

 private:
  DecodeStepModel model_;  // the tensors the table points into
  DecodeStepDims dims_;
  std::array<DecodeStepPlan, 4> plans_;
  std::array<bool, 4> takes_;
  ElementType elem_ = ElementType::kBF16;
  int64_t max_window_ = 0;
  torch::Tensor table_, sync_;
  StepTrace trace_;

  static std::string trace_path() {
    const char* p = std::getenv("TANDEM_DECODE_STEP_TRACE");
    return p == nullptr ? "" : p;
  }
};

// Why the model does not suit the step at all ("" when it does), its dims into *dims.
std::string model_refusal(const DecodeStepModel& m, DecodeStepDims* dims) {
  const auto device = m.embed.device();
  if (!m.lm_head.defined() || m.lm_head.dim() != 2 || m.layers[0].gate_up.dim() != 2 || m.layers[0].k_cache.dim() != 4)
    return "a model without its output projection, feed-forward or caches";
  const auto t = m.lm_head.scalar_type();
  if (t != torch::kBFloat16 && t != torch::kHalf) return "matrices that are neither bf16 nor fp16";
  DecodeStepDims d;
  d.n_layer = static_cast<int64_t>(m.layers.size());
  d.C = m.lm_head.size(1);
  d.V = m.lm_head.size(0);
  d.H = m.n_head, d.KV = m.n_kv_head, d.hd = m.head_dim;
  d.rotary = m.cos.defined() ? m.cos.size(-1) : 0;
  d.F = m.layers[0].gate_up.size(0) / 2;
  d.page_tokens = m.layers[0].k_cache.size(2);
  d.elem_bytes = 2;
  d.eps = static_cast<float>(m.eps);
  d.scale = static_cast<float>(m.scale > 0 ? m.scale : 1.0 / std::sqrt(double(m.head_dim)));
  d.plus_one = m.plus_one;
  const int64_t Q = (d.H + 2 * d.KV) * d.hd;
  std::string why;
  const auto check = [&](const char* what, const torch::Tensor& x, torch::ScalarType dtype, int64_t numel,
                         bool optional = false) {
    if (why.empty()) why = tensor_refusal(what, x, device, dtype, numel, optional);
  };
  check("embedding", m.embed, t, m.embed.defined() ? m.embed.size(0) * d.C : 0);
  check("output projection", m.lm_head, t, d.V * d.C);
  check("final norm", m.final_norm, torch::kFloat32, d.C);
  if (!m.cos.defined() || !m.sin.defined()) return "no RoPE (learned positions)";
  check("RoPE table", m.cos, t, m.cos.numel());
  check("RoPE table", m.sin, t, m.cos.numel());
  for (const auto& l : m.layers) {
    check("q/k/v projection", l.qkv, t, Q * d.C);
    check("q/k/v bias", l.qkv_bias, t, Q, true);
    check("output projection", l.o, t, d.C * d.H * d.hd);
    check("output bias", l.o_bias, t, d.C, true);
    check("gate/up projection", l.gate_up, t, 2 * d.F * d.C);
    check("gate/up bias", l.gate_up_bias, t, 2 * d.F, true);
    check("down projection", l.down, t, d.C * d.F);
    check("down bias", l.down_bias, t, d.C, true);
    check("attention norm", l.attn_norm, torch::kFloat32, d.C);
    check("feed-forward norm", l.ff_norm, torch::kFloat32, d.C);
    const int64_t cache = l.k_cache.defined() ? l.k_cache.numel() : 0;
    check("key cache", l.k_cache, t, cache);
    check("value cache", l.v_cache, t, cache);
    if (why.empty() && (l.k_cache.dim() != 4 || l.k_cache.size(1) != d.KV || l.k_cache.size(2) != d.page_tokens ||
                        l.k_cache.size(3) != d.hd || l.v_cache.sizes() != l.k_cache.sizes()))
      why = "a key/value cache of another shape";
  }
  *dims = d;
  return why;
}

std::unique_ptr<DecodeStep> make_cuda(const DecodeStepModel& model, std::string* why) {
  const c10::cuda::CUDAGuard guard(model.embed.device());
  if (compute_capability_major() < 9) {
    *why = "a GPU before compute capability 9.0 (the bulk copies are Hopper's)";
    return nullptr;
  }
  DecodeStepDims dims;
  if (std::string refusal = model_refusal(model, &dims); !refusal.empty()) {
    *why = refusal;
    return nullptr;
  }
  std::array<DecodeStepPlan, 4> plans{};
  std::array<bool, 4> takes{};
  std::string last;
  for (int64_t rows = 1; rows <= DecodeStep::kMaxRows; ++rows) {
    DecodeStepDims d = dims;
    d.rows = rows;
    const std::string r =
        plan_decode_step(d, multiprocessor_count(), max_shared_per_block(), &plans[static_cast<size_t>(rows - 1)]);
    takes[static_cast<size_t>(rows - 1)] = r.empty();
    if (!r.empty()) last = r;
  }
  if (!takes[0]) {
    *why = last;
    return nullptr;
  }
  auto step = std::make_unique<CudaDecodeStep>(model, dims, plans, takes);
  int64_t window = 0;
  for (const auto& l : model.layers) window = std::max(window, l.window);
  step->set_max_window(window);
  return step;
}

struct Register {
  Register() { decode_step_cuda() = &make_cuda; }
} register_decode_step_cuda;

}  // namespace
}  // namespace tandem::detail
