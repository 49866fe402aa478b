// `tandem bench optim`'s parts (bench/optim_bench.h): parameter counts as written on the command line,
// and a run on tiny sizes: one JSON line per measurement with its variant, bytes per parameter and
// the statistics of its times, the extra kernel levels, and its refusals.

#include "tandem/bench/optim_bench.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../test_util.h"
#include "bench_guard.h"
#include "tandem/optim/cpu_update.h"

namespace tandem {
namespace {

using nlohmann::json;
using test::error_of;

using test::BenchGuard;

std::vector<json> json_lines(const std::string& path) {
  std::vector<json> out;
  std::istringstream in(test::read_text(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

TEST(OptimBench, ParameterCountsTakeBinarySuffixes) {
  EXPECT_EQ(parse_param_count("1000000"), 1000000);
  EXPECT_EQ(parse_param_count("1"), 1);
  EXPECT_EQ(parse_param_count("2K"), 2048);
  EXPECT_EQ(parse_param_count("2k"), 2048);
  EXPECT_EQ(parse_param_count("256M"), int64_t{256} << 20);
  EXPECT_EQ(parse_param_count("256m"), int64_t{256} << 20);
  EXPECT_EQ(parse_param_count("1B"), int64_t{1} << 30);
  EXPECT_EQ(parse_param_count("1G"), int64_t{1} << 30);
  EXPECT_EQ(parse_param_count("3b"), int64_t{3} << 30);
  EXPECT_EQ(parse_param_count("2g"), int64_t{2} << 30);
  EXPECT_EQ(parse_param_count("1.5G"), int64_t{3} << 29);
  EXPECT_EQ(parse_param_count("0.5K"), 512);
  EXPECT_EQ(parse_param_count("1e3"), 1000);
  EXPECT_EQ(parse_param_count("100.4"), 100) << "rounded to a whole count";
  EXPECT_EQ(parse_param_count("16B"), int64_t{16} << 30) << "past 2^32";
}

TEST(OptimBench, AParameterCountThatIsNotOneIsRefusedWithAnExample) {
  EXPECT_NE(error_of([] { parse_param_count(""); }).find("empty parameter count; write e.g. 256M"), std::string::npos);
  for (const std::string bad :
       {"abc", "12X", "12 M", "M", "0", "-5", "-1M", "0K", "1MB", "nan", "0.4", "1e19", "inf"}) {
    const std::string err = error_of([&] { parse_param_count(bad); });
    EXPECT_NE(err.find("cannot read parameter count '" + bad + "'"), std::string::npos) << "'" << bad << "': " << err;
    EXPECT_NE(err.find("256M, 1B or 1000000"), std::string::npos) << err;
  }
}

// Each size: the copy bandwidth, the fourteen tandem variants at the best level, a clipped step's
// retraction and redo as two passes and as one, LibTorch's two AdamWs.
TEST(OptimBench, WritesOneJsonLinePerMeasurementWithItsBytesAndTimes) {
  BenchGuard guard;
  test::TempDir dir;
  OptimBenchOptions o;
  o.sizes = {17, 1};
  o.repeats = 3;
  o.warmup = 1;
  o.threads = 1;
  o.json_path = dir.file("optim.jsonl");
  std::ofstream(o.json_path) << "{\"earlier\": true}\n";
  testing::internal::CaptureStdout();
  const int code = run_optim_bench(o);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(code, 0);
  const std::string best = to_string(best_cpu_isa());
  EXPECT_EQ(out.rfind("tandem bench optim: 1 threads, kernels " + best +
                          ", AdamW lr 0.001 betas (0.9, 0.95) eps 1e-08 wd 0.1\n",
                      0),
            0u)
      << out;

  const auto lines = json_lines(o.json_path);
  ASSERT_EQ(lines.size(), 1u + 2 * 19) << "appended after what the file held";
  EXPECT_EQ(lines[0], json({{"earlier", true}}));
  struct Want {
    std::string impl, variant;
    int bytes;
  };
  const auto tandem_variant = [&](const std::string& name, Dtype g, Dtype s, bool out_copy, int master_bytes = 4) {
    return Want{"tandem", name + " [" + best + "]",
                bytes_per_element(UpdateRule::kAdamW, g, s, out_copy, master_bytes)};
  };
  const std::vector<Want> per_size = {
      {"memcpy", "fp32 copy (read + write)", 8},
      tandem_variant("AdamW fp32 grads, fp32 states", Dtype::kF32, Dtype::kF32, false),
      tandem_variant("AdamW fp32 grads, fp32 states, bf16 out", Dtype::kF32, Dtype::kF32, true),
      tandem_variant("AdamW bf16 grads, fp32 states, bf16 out", Dtype::kBF16, Dtype::kF32, true),
      tandem_variant("AdamW fp32 grads, bf16 states", Dtype::kF32, Dtype::kBF16, false),
      tandem_variant("AdamW bf16 grads, bf16 states", Dtype::kBF16, Dtype::kBF16, false),
      tandem_variant("AdamW bf16 grads, bf16 states, bf16 out", Dtype::kBF16, Dtype::kBF16, true),
      tandem_variant("AdamW fp32 grads, fp32 states, unchecked", Dtype::kF32, Dtype::kF32, false),
      tandem_variant("AdamW bf16 grads, bf16 states, unchecked", Dtype::kBF16, Dtype::kBF16, false),
      tandem_variant("AdamW fp32 grads, int8 states", Dtype::kF32, Dtype::kQ8, false),
      tandem_variant("AdamW bf16 grads, int8 states, bf16 out", Dtype::kBF16, Dtype::kQ8, true),
      tandem_variant("AdamW bf16 grads, int8 states (stochastic codes), bf16 out", Dtype::kBF16, Dtype::kQ8, true),
      tandem_variant("AdamW bf16 grads, bf16 states, bf16 master (stochastic), bf16 out", Dtype::kBF16, Dtype::kBF16,
                     true, 2),
      tandem_variant("AdamW bf16 grads, int8 states, bf16 master (stochastic), bf16 out", Dtype::kBF16, Dtype::kQ8,
                     true, 2),
      tandem_variant("AdamW bf16 grads, int8 states, bf16 master (kahan), bf16 out", Dtype::kBF16, Dtype::kQ8, true),
      {"tandem", "retract, then update: bf16 grads, bf16 states, bf16 out [" + best + "]", 40},
      {"tandem", "retract + update in one pass: bf16 grads, bf16 states, bf16 out [" + best + "]", 20},
      {"torch", "fused AdamW (at::_fused_adamw_)", 28},
      {"torch", "foreach AdamW (at::_foreach_* ops)", 28}};
  EXPECT_EQ(per_size[1].bytes, 28) << "fp32 master, grad, m, v read and master, m, v written";
  EXPECT_EQ(per_size[9].bytes, 16) << "8-bit states: one byte each way per state";
  EXPECT_EQ(per_size[13].bytes, 12) << "and a bf16 master: two bytes each way";
  for (size_t i = 1; i < lines.size(); ++i) {
    const json& j = lines[i];
    const Want& w = per_size[(i - 1) % 19];
    const int64_t n = i <= 19 ? 17 : 1;
    SCOPED_TRACE(::testing::Message() << "line " << i << ": " << j.dump());
    EXPECT_EQ(j["impl"], w.impl);
    EXPECT_EQ(j["variant"], w.variant);
    EXPECT_EQ(j["params"], n);
    EXPECT_EQ(j["threads"], 1);
    EXPECT_EQ(j["bytes_per_param"], w.bytes);
    std::vector<double> times = j["times_s"].get<std::vector<double>>();
    ASSERT_EQ(times.size(), 3u) << "the warm-up step is not timed";
    std::sort(times.begin(), times.end());
    EXPECT_EQ(j["median_s"].get<double>(), times[1]);
    EXPECT_EQ(j["min_s"].get<double>(), times[0]);
    EXPECT_GT(times[0], 0.0);
    EXPECT_DOUBLE_EQ(j["params_per_s"].get<double>(), double(n) / times[1]);
    EXPECT_DOUBLE_EQ(j["gbps"].get<double>(), double(n) * w.bytes / times[1] / 1e9);
  }
  // The closing table: a header and one row per measurement.
  const std::string table = out.substr(out.find("\nimpl "));
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 1 + 1 + 38) << table;
  EXPECT_NE(table.find("B/par"), std::string::npos);
}

TEST(OptimBench, ExtraKernelLevelsTimeThePlainFp32VariantOnly) {
  if (best_cpu_isa() == CpuIsa::kScalar) GTEST_SKIP() << "this CPU runs the scalar kernels only";
  BenchGuard guard;
  test::TempDir dir;
  OptimBenchOptions o;
  o.sizes = {7};
  o.repeats = 1;
  o.warmup = 0;
  o.threads = 1;
  o.isas = {"scalar", to_string(best_cpu_isa()), "scalar"};  // repeats and the best one add nothing
  o.json_path = dir.file("optim.jsonl");
  testing::internal::CaptureStdout();
  run_optim_bench(o);
  testing::internal::GetCapturedStdout();
  std::vector<std::string> scalar;
  const auto lines = json_lines(o.json_path);
  for (const auto& j : lines) {
    const std::string v = j["variant"];
    if (v.find("[scalar]") != std::string::npos) scalar.push_back(v);
  }
  EXPECT_EQ(lines.size(), 20u);
  EXPECT_EQ(scalar, std::vector<std::string>{"AdamW fp32 grads, fp32 states [scalar]"});
  EXPECT_EQ(active_cpu_isa(), best_cpu_isa()) << "the bench leaves the best level active";
}

TEST(OptimBench, BadOptionsAreRefusedBeforeAnythingIsTimed) {
  BenchGuard guard;
  const auto refused = [](void (*edit)(OptimBenchOptions&)) {
    OptimBenchOptions o;
    o.sizes = {3};
    o.repeats = 1;
    o.warmup = 0;
    o.threads = 1;
    edit(o);
    testing::internal::CaptureStdout();
    const std::string err = error_of([&] { run_optim_bench(o); });
    const std::string out = testing::internal::GetCapturedStdout();
    EXPECT_EQ(out.find("memcpy"), std::string::npos) << "timed before refusing: " << out;
    return err;
  };
  EXPECT_NE(refused([](OptimBenchOptions& o) { o.repeats = 0; }).find("--repeats must be >= 1"), std::string::npos);
  EXPECT_NE(refused([](OptimBenchOptions& o) { o.warmup = -1; }).find("--warmup >= 0"), std::string::npos);
  EXPECT_NE(refused([](OptimBenchOptions& o) { o.isas = {"avx9"}; }).find("unknown CPU kernel level 'avx9'"),
            std::string::npos);
  EXPECT_NE(refused([](OptimBenchOptions& o) {
              o.json_path = "/nonexistent-dir/optim.jsonl";
            }).find("cannot open '/nonexistent-dir/optim.jsonl' for writing"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
