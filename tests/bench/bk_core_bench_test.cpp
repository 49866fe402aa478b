// `tandem bench bk_core` (bench/bk_core_bench.h) on the CPU at tiny B and N: which implementations
// each grid point runs, each row's bandwidth floor, the table, and the refusals that come before
// the copy-bandwidth probe.

#include "tandem/bench/bk_core_bench.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../test_util.h"

namespace tandem {
namespace {

using nlohmann::json;

TEST(BkCoreBench, BadOptionsAreRefusedBeforeTheBandwidthProbe) {
  const auto refused = [](void (*edit)(BkCoreBenchOptions&)) {
    BkCoreBenchOptions o;
    o.batches = {1};
    o.lengths = {4};
    o.device = "cpu";
    edit(o);
    testing::internal::CaptureStdout();
    const std::string err = test::error_of([&] { run_bk_core_bench(o); });
    const std::string out = testing::internal::GetCapturedStdout();
    EXPECT_EQ(out, "") << "measured before refusing";
    return err;
  };
  EXPECT_NE(refused([](BkCoreBenchOptions& o) { o.repeats = 0; }).find("--repeats must be >= 1"), std::string::npos);
  EXPECT_NE(refused([](BkCoreBenchOptions& o) { o.device = "tpu"; }).find("--device"), std::string::npos);
  EXPECT_NE(refused([](BkCoreBenchOptions& o) {
              o.json_path = "/nonexistent-dir/bk.jsonl";
            }).find("cannot open '/nonexistent-dir/bk.jsonl' for writing"),
            std::string::npos);
  if (!torch::cuda::is_available()) {
    EXPECT_NE(refused([](BkCoreBenchOptions& o) { o.device = "cuda"; }).find("no CUDA device is visible"),
              std::string::npos);
  }
}

// One run (its bandwidth probe copies 1 GiB a few times: about a second): the three kernels at every
// point, the LibTorch-ops baseline where B*N <= ops_max_elements and N <= 8192, no cuSPARSE on the CPU.
TEST(BkCoreBench, EachGridPointRunsItsImplementationsAgainstOneBandwidthFloor) {
  test::TempDir dir;
  BkCoreBenchOptions o;
  o.batches = {1, 2};
  o.lengths = {1, 17, 8193};
  o.device = "cpu";
  o.repeats = 2;
  o.ops_max_elements = 17;
  o.json_path = dir.file("bk.jsonl");
  testing::internal::CaptureStdout();
  const int code = run_bk_core_bench(o);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(code, 0);

  std::vector<json> rows;
  std::istringstream in(test::read_text(o.json_path));
  for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
  const std::vector<std::string> kernels = {"kernel complex128", "kernel complex64", "kernel mixed"};
  struct Point {
    int64_t B, N;
    bool ops;
  };
  const Point grid[] = {{1, 1, true},    {1, 17, true},  {1, 8193, false},  // N > 8192: never the ops
                        {2, 1, true},    {2, 17, false},                    // B*N = 34 > 17
                        {2, 8193, false}};
  std::vector<std::string> want, got;
  for (const Point& p : grid) {
    for (const auto& k : kernels) want.push_back(std::to_string(p.B) + " " + std::to_string(p.N) + " " + k);
    if (p.ops) want.push_back(std::to_string(p.B) + " " + std::to_string(p.N) + " LibTorch ops complex128");
  }
  for (const auto& r : rows)
    got.push_back(std::to_string(r["B"].get<int64_t>()) + " " + std::to_string(r["N"].get<int64_t>()) + " " +
                  r["impl"].get<std::string>());
  EXPECT_EQ(got, want);
  ASSERT_FALSE(rows.empty());

  const double bw = rows[0]["copy_bytes_per_s"];
  EXPECT_GT(bw, 1e8) << "bytes per second of a 1 GiB copy";
  for (const auto& r : rows) {
    SCOPED_TRACE(r.dump());
    EXPECT_EQ(r["device"], "cpu");
    EXPECT_EQ(r["copy_bytes_per_s"].get<double>(), bw) << "one probe for the whole grid";
    const double esz = r["impl"] == "kernel complex128" || r["impl"] == "LibTorch ops complex128" ? 8 : 4;
    // a, b, c read and G (complex) written, at the copy's rate.
    EXPECT_DOUBLE_EQ(r["floor_s"].get<double>(),
                     double(r["B"].get<int64_t>()) * double(r["N"].get<int64_t>()) * 5 * esz / bw);
    EXPECT_GT(r["fwd_s"].get<double>(), 0.0);
    ASSERT_TRUE(r.contains("fwd_bwd_s")) << "every CPU implementation has a backward";
    EXPECT_GT(r["fwd_bwd_s"].get<double>(), 0.0);
    EXPECT_FALSE(r.contains("max_rel_diff_vs_kernel"));
  }

  // The header and one table line per row, in the same order.
  std::istringstream lines(out);
  std::string line;
  std::getline(lines, line);
  EXPECT_EQ(line.rfind("tandem bench bk_core on cpu: copy bandwidth ", 0), 0u) << line;
  std::getline(lines, line);
  EXPECT_NE(line.find("implementation"), std::string::npos) << line;
  EXPECT_NE(line.find("floor %"), std::string::npos) << line;
  size_t i = 0;
  for (; std::getline(lines, line) && i < rows.size(); ++i) {
    std::istringstream fields(line);
    int64_t B = 0, N = 0;
    fields >> B >> N;
    EXPECT_EQ(B, rows[i]["B"].get<int64_t>()) << line;
    EXPECT_EQ(N, rows[i]["N"].get<int64_t>()) << line;
    EXPECT_NE(line.find(rows[i]["impl"].get<std::string>()), std::string::npos) << line;
    EXPECT_EQ(line.back(), '%') << line;
  }
  EXPECT_EQ(i, rows.size()) << out;
}

}  // namespace
}  // namespace tandem
