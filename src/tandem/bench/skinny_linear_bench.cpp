#include "tandem/bench/skinny_linear_bench.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "tandem/core/device_graph.h"
#include "tandem/core/error.h"
#include "tandem/core/stats.h"
#include "tandem/kernels/skinny_linear.h"

namespace tandem {
namespace {

struct Shape {
  int64_t O = 0, K = 0;
};

Shape parse_shape(const std::string& s) {
  const auto x = s.find('x');
  TANDEM_CHECK(x != std::string::npos && x > 0 && x + 1 < s.size(), "--shapes: '", s,
               "' is not OxK (outputs x inputs), e.g. 2048x5632");
  try {
    size_t used = 0;
    const Shape shape{std::stoll(s.substr(0, x), &used), std::stoll(s.substr(x + 1))};
    TANDEM_CHECK(used == x && shape.O > 0 && shape.K > 0 && shape.K % 8 == 0, "--shapes: '", s,
                 "' needs positive O and K, K a multiple of 8");
    return shape;
  } catch (const std::logic_error&) {
    TANDEM_CHECK(false, "--shapes: '", s, "' is not OxK (outputs x inputs), e.g. 2048x5632");
  }
  return {};
}

// Median seconds of one replay of `graph`.
double replay_seconds(DeviceGraph& graph, int repeats) {
  graph.replay();
  torch::cuda::synchronize();
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    graph.replay();
    torch::cuda::synchronize();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(t);
}

}  // namespace

int run_skinny_linear_bench(const SkinnyLinearBenchOptions& o) {
  TANDEM_CHECK(torch::cuda::is_available(), "tandem bench skinny_linear needs a CUDA device; this machine has none");
  TANDEM_CHECK(o.rows >= 1 && o.rows <= 4, "--rows ", o.rows, ": the skinny linear takes 1 to 4 rows");
  TANDEM_CHECK(o.repeats >= 1, "--repeats ", o.repeats, ": give at least 1");
  std::vector<std::string> names = o.shapes;
  if (names.empty())  // q/k/v, o, gate/up, down: 1B folder (GQA 32/4, FFN 5632), then Llama-2-7B
    names = {"2560x2048",  "2048x2048", "11264x2048", "2048x5632",
             "12288x4096", "4096x4096", "22016x4096", "4096x11008"};
  GraphRecorder* recorder = graph_recorder();
  TANDEM_CHECK(recorder != nullptr, "tandem bench skinny_linear needs a build with CUDA graphs");
  const c10::Device cuda(c10::kCUDA, 0);
  const auto opts = torch::TensorOptions().dtype(torch::kBFloat16).device(cuda);
  constexpr int64_t kSpill = int64_t{1} << 30;  // weights read per replay: many times any L2
  std::printf("%-12s %9s %6s | %14s %9s | %14s %9s | %s\n", "shape OxK", "MB", "copies", "skinny us", "GB/s",
              "cuBLAS us", "GB/s", "skinny/cuBLAS time");
  for (const auto& name : names) {
    const Shape s = parse_shape(name);
    const int64_t bytes = s.O * s.K * 2;
    const int64_t copies = std::clamp<int64_t>(kSpill / bytes, 1, 256);
    std::vector<torch::Tensor> w;
    for (int64_t c = 0; c < copies; ++c) w.push_back(torch::randn({s.O, s.K}, opts) * 0.02);
    const auto x = torch::randn({o.rows, s.K}, opts);
    TANDEM_CHECK(skinny_linear_takes(x, w[0]), "the skinny linear does not take ", name, " at ", o.rows,
                 " rows in this build");
    torch::Tensor y;
    const auto skinny = recorder->record(0, [&] {
      for (const auto& wc : w) y = skinny_linear(x, wc, {});
    });
    const auto cublas = recorder->record(0, [&] {
      for (const auto& wc : w) y = torch::nn::functional::linear(x, wc);
    });
    const double ts = replay_seconds(*skinny, o.repeats) / double(copies);
    const double tc = replay_seconds(*cublas, o.repeats) / double(copies);
    std::printf("%-12s %9.1f %6lld | %14.2f %9.0f | %14.2f %9.0f | %.2f\n", name.c_str(), double(bytes) / 1e6,
                static_cast<long long>(copies), ts * 1e6, double(bytes) / ts / 1e9, tc * 1e6, double(bytes) / tc / 1e9,
                ts / tc);
    std::fflush(stdout);
    if (!o.json_path.empty()) {
      std::ofstream out(o.json_path, std::ios::app);
      out << nlohmann::json{{"bench", "skinny_linear"},
                            {"O", s.O},
                            {"K", s.K},
                            {"rows", o.rows},
                            {"bytes", bytes},
                            {"skinny_s", ts},
                            {"cublas_s", tc},
                            {"skinny_gbs", double(bytes) / ts / 1e9},
                            {"cublas_gbs", double(bytes) / tc / 1e9}}
                 .dump()
          << "\n";
    }
  }
  return 0;
}

}  // namespace tandem
