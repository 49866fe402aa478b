#include "tandem/bench/nvme_bench.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"
#include "tandem/memory/nvme_tier.h"
#include "tandem/memory/pinned.h"

namespace tandem {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Rates {
  double write_gbs = 0, read_gbs = 0, mixed_gbs = 0;
};

// Files of `blocks` Blocks of `block` bytes; two buffers, as the tier's bounce slots.
Rates measure(NvmeTier& tier, int64_t blocks, int64_t block) {
  std::vector<int> files;
  for (int64_t k = 0; k < blocks; ++k) files.push_back(tier.add_file("bench" + std::to_string(k), block));
  std::vector<torch::Tensor> slots;
  for (int s = 0; s < 3; ++s) {
    slots.push_back(host_tensor(block, torch::kUInt8, HostMemory::kPageable));
    slots.back().fill_(s + 1);
  }
  const double total = double(blocks * block);
  Rates r;
  // Every Block written, two in flight.
  auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> tickets;
  for (int64_t k = 0; k < blocks; ++k) {
    if (k >= 2) tier.wait(tickets[static_cast<size_t>(k - 2)]);
    tickets.push_back(tier.write(files[static_cast<size_t>(k)], 0, slots[static_cast<size_t>(k % 2)].data_ptr(), block));
  }
  for (const auto t : tickets) tier.wait(t);
  r.write_gbs = total / seconds_since(t0) / 1e9;
  // Every Block read, two in flight.
  tickets.clear();
  t0 = std::chrono::steady_clock::now();
  for (int64_t k = 0; k < blocks; ++k) {
    if (k >= 2) tier.wait(tickets[static_cast<size_t>(k - 2)]);
    tickets.push_back(tier.read(files[static_cast<size_t>(k)], 0, slots[static_cast<size_t>(k % 2)].data_ptr(), block));
  }
  for (const auto t : tickets) tier.wait(t);
  r.read_gbs = total / seconds_since(t0) / 1e9;
  // The updater's pattern: Block k+1 read while Block k-1 is written back (three slots).
  t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> reads(static_cast<size_t>(blocks), 0), writes(static_cast<size_t>(blocks), 0);
  reads[0] = tier.read(files[0], 0, slots[0].data_ptr(), block);
  for (int64_t k = 0; k < blocks; ++k) {
    const auto slot = [&](int64_t j) { return slots[static_cast<size_t>(j % 3)].data_ptr(); };
    tier.wait(reads[static_cast<size_t>(k)]);
    if (k >= 2) tier.wait(writes[static_cast<size_t>(k - 2)]);  // the slot Block k+1 reads into
    if (k + 1 < blocks) reads[static_cast<size_t>(k + 1)] = tier.read(files[static_cast<size_t>(k + 1)], 0, slot(k + 1), block);
    writes[static_cast<size_t>(k)] = tier.write(files[static_cast<size_t>(k)], 0, slot(k), block);
  }
  for (const auto t : writes) tier.wait(t);
  r.mixed_gbs = 2 * total / seconds_since(t0) / 1e9;
  return r;
}

}  // namespace

int run_nvme_bench(const NvmeBenchOptions& o) {
  TANDEM_CHECK(!o.dir.empty(), "bench nvme: give the directory to measure with --dir (offload.nvme_path's disk)");
  TANDEM_CHECK(o.gib > 0 && o.block_mib > 0, "bench nvme: --gib and --block-mib must be positive");
  const int64_t block = o.block_mib << 20;
  const int64_t blocks = std::max<int64_t>(2, static_cast<int64_t>(o.gib * double(int64_t{1} << 30) / double(block)));
  std::printf("NVMe tier in %s: %lld files of %lld MiB (%.2f GiB), two transfers in flight\n", o.dir.c_str(),
              (long long)blocks, (long long)o.block_mib, double(blocks * block) / double(int64_t{1} << 30));
  std::printf("  %-14s %-10s %12s %12s %22s\n", "I/O", "O_DIRECT", "write GB/s", "read GB/s", "read+write GB/s");
  for (const bool async : {true, false}) {
    NvmeTier tier(o.dir, async);
    if (async && !tier.async()) continue;  // said by the tier
    const Rates r = measure(tier, blocks, block);
    const char* io = tier.async() ? "io_uring" : "pread/pwrite";
    std::printf("  %-14s %-10s %12.2f %12.2f %22.2f\n", io, tier.direct() ? "yes" : "no", r.write_gbs, r.read_gbs,
                r.mixed_gbs);
    if (!o.json_path.empty()) {
      std::ofstream out(o.json_path, std::ios::app);
      out << nlohmann::json{{"bench", "nvme"},          {"io", io},
                            {"direct", tier.direct()},  {"bytes", blocks * block},
                            {"block_bytes", block},     {"write_gbs", r.write_gbs},
                            {"read_gbs", r.read_gbs},   {"read_write_gbs", r.mixed_gbs}}
                 .dump()
          << "\n";
    }
  }
  return 0;
}

}  // namespace tandem
