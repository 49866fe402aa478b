#include "tandem/bench/bk_core_bench.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "tandem/core/error.h"
#include "tandem/core/stats.h"
#include "tandem/kernels/bk_core.h"
#include "tandem/run/run_setup.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

void sync(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

// Median seconds of `repeats` calls after one warm-up call.
double time_median(const torch::Device& dev, int repeats, const std::function<void()>& f) {
  f();
  sync(dev);
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = Clock::now();
    f();
    sync(dev);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(t);
}

// Bytes read + written per second by a large device-to-device copy.
double copy_bandwidth(const torch::Device& dev) {
  // Written first: a never-written host buffer reads the kernel's zero page, faster than memory.
  auto src = torch::ones({int64_t(1) << 28}, torch::TensorOptions().dtype(torch::kFloat32).device(dev));
  auto dst = torch::empty_like(src);
  const double t = time_median(dev, 5, [&] { dst.copy_(src); });
  return 2.0 * double(src.numel()) * 4.0 / t;
}

}  // namespace

namespace detail {
BkCoreCusparseFn& bk_core_cusparse() {
  static BkCoreCusparseFn fn = nullptr;
  return fn;
}
}  // namespace detail

int run_bk_core_bench(const BkCoreBenchOptions& o) {
  TANDEM_CHECK(o.repeats >= 1, "--repeats must be >= 1");
  const torch::Device dev = resolve_device(o.device, "--device");
  std::unique_ptr<std::ofstream> json;
  if (!o.json_path.empty()) {
    json = std::make_unique<std::ofstream>(o.json_path, std::ios::app);
    TANDEM_CHECK(json->good(), "cannot open '", o.json_path, "' for writing; check the directory");
  }
  const double bw = copy_bandwidth(dev);
  std::printf("tandem bench bk_core on %s: copy bandwidth %.0f GB/s (read + write)\n", dev.str().c_str(), bw / 1e9);
  std::printf("%6s %8s  %-26s %12s %12s %10s\n", "B", "N", "implementation", "fwd ms", "fwd+bwd ms", "floor %");
  for (const int64_t B : o.batches)
    for (const int64_t N : o.lengths) {
      torch::manual_seed(0);
      const auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(dev);
      const auto a = torch::rand({B, N}, f64) * 2 - 1, b = 0.2 + 0.8 * torch::rand({B, N - 1}, f64),
                 c = 0.2 + 0.8 * torch::rand({B, N - 1}, f64);
      const auto z = torch::complex(torch::tensor(0.1, f64), torch::tensor(0.5, f64));
      struct Impl {
        std::string name;
        torch::ScalarType real;
        BkCoreMode mode;
        enum Kind { kKernel, kOps, kCusparse } kind;
      };
      std::vector<Impl> impls = {{"kernel complex128", torch::kFloat64, BkCoreMode::kNative, Impl::kKernel},
                                 {"kernel complex64", torch::kFloat32, BkCoreMode::kNative, Impl::kKernel},
                                 {"kernel mixed", torch::kFloat32, BkCoreMode::kMixed, Impl::kKernel}};
      if (B * N <= o.ops_max_elements && N <= 8192)
        impls.push_back({"LibTorch ops complex128", torch::kFloat64, BkCoreMode::kNative, Impl::kOps});
      if (dev.is_cuda() && detail::bk_core_cusparse() && double(B) * double(N) * double(N) <= o.cusparse_max_elements)
        impls.push_back({"cuSPARSE gtsv2 complex128", torch::kFloat64, BkCoreMode::kNative, Impl::kCusparse});
      for (const auto& im : impls) {
        const auto ar = a.to(im.real), br = b.to(im.real), cr = c.to(im.real);
        const auto run = [&](bool backward) {
          auto aa = ar.detach().requires_grad_(backward), bb = br.detach().requires_grad_(backward),
               cc = cr.detach().requires_grad_(backward);
          auto g = im.kind == Impl::kOps        ? detail::bk_core_ops(aa, bb, cc, z)
                   : im.kind == Impl::kCusparse ? detail::bk_core_cusparse()(aa, bb, cc, z)
                                                : bk_core(aa, bb, cc, z, im.mode);
          if (backward) torch::real(g).sum().backward();
        };
        const int reps = im.kind == Impl::kOps ? 1 : o.repeats;
        const double tf = time_median(dev, reps, [&] {
          torch::NoGradGuard ng;
          run(false);
        });
        // cuSPARSE has no backward: its fwd+bwd column stays empty.
        const double tb = im.kind == Impl::kCusparse ? 0.0 : time_median(dev, reps, [&] { run(true); });
        const double esz = im.real == torch::kFloat64 ? 8 : 4;
        const double floor_s = double(B) * double(N) * (3 * esz + 2 * esz) / bw;  // a, b, c in; G out
        const std::string tb_text = tb > 0 ? std::to_string(tb * 1e3).substr(0, 10) : std::string("-");
        std::string note;
        nlohmann::json row{{"B", B},
                           {"N", N},
                           {"impl", im.name},
                           {"fwd_s", tf},
                           {"floor_s", floor_s},
                           {"device", dev.str()},
                           {"copy_bytes_per_s", bw}};
        if (tb > 0) row["fwd_bwd_s"] = tb;
        if (im.kind == Impl::kCusparse) {  // the same diagonal as the kernel, or the comparison is void
          torch::NoGradGuard ng;
          const auto mine = bk_core(ar, br, cr, z), theirs = detail::bk_core_cusparse()(ar, br, cr, z);
          const double diff = ((theirs - mine).abs() / mine.abs()).max().item<double>();
          row["max_rel_diff_vs_kernel"] = diff;
          char buf[64];
          std::snprintf(buf, sizeof buf, "  (max rel diff vs kernel %.1e)", diff);
          note = buf;
        }
        std::printf("%6lld %8lld  %-26s %12.3f %12s %9.1f%%%s\n", static_cast<long long>(B), static_cast<long long>(N),
                    im.name.c_str(), tf * 1e3, tb_text.c_str(), 100.0 * floor_s / tf, note.c_str());
        std::fflush(stdout);
        if (json) *json << row.dump() << '\n';
      }
    }
  return 0;
}

}  // namespace tandem
