// Note [NVMe tier]: the tier's files read back what was written, through io_uring where the kernel
// allows it and through pread/pwrite, with many transfers in flight at once, transfers of many
// requests, lengths rounded up to the alignment, and files that are gone from the directory.
#include "tandem/memory/nvme_tier.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "../test_util.h"
#include "tandem/memory/pinned.h"

namespace tandem {
namespace {

torch::Tensor aligned_bytes(int64_t n) {
  return host_tensor(NvmeTier::aligned(n), torch::kUInt8, HostMemory::kPageable);
}

TEST(NvmeTier, FilesReadBackWhatWasWrittenWithManyTransfersInFlight) {
  test::TempDir tmp;
  for (const bool async : {true, false}) {
    SCOPED_TRACE(async ? "io_uring where allowed" : "pread/pwrite");
    NvmeTier tier(tmp.file(async ? "a" : "s"), async);
    if (!async) EXPECT_FALSE(tier.async());
    // Sizes below the alignment, across it, and of several requests with a short tail.
    const std::vector<int64_t> sizes = {100, NvmeTier::kAlign + 1, 2 * NvmeTier::kRequestBytes + 12345};
    std::vector<int> files;
    std::vector<torch::Tensor> written;
    for (size_t k = 0; k < sizes.size(); ++k) {
      files.push_back(tier.add_file("block" + std::to_string(k), 2 * sizes[k]));
      auto w = aligned_bytes(sizes[k]);
      w.narrow(0, 0, sizes[k]).copy_(torch::randint(0, 255, {sizes[k]}, torch::kUInt8));
      written.push_back(w);
    }
    // Every write in flight together, at offset 0 and at the next aligned offset.
    std::vector<int64_t> tickets;
    for (size_t k = 0; k < sizes.size(); ++k) {
      tickets.push_back(tier.write(files[k], 0, written[k].data_ptr(), sizes[k]));
      tickets.push_back(tier.write(files[k], NvmeTier::aligned(sizes[k]), written[k].data_ptr(), sizes[k]));
    }
    for (auto it = tickets.rbegin(); it != tickets.rend(); ++it) tier.wait(*it);  // out of order
    tickets.clear();
    std::vector<torch::Tensor> read;
    for (size_t k = 0; k < sizes.size(); ++k) {
      read.push_back(aligned_bytes(sizes[k]));
      tickets.push_back(tier.read(files[k], NvmeTier::aligned(sizes[k]), read[k].data_ptr(), sizes[k]));
    }
    for (const auto t : tickets) tier.wait(t);
    for (const auto t : tickets) tier.wait(t);  // a second wait returns at once
    for (size_t k = 0; k < sizes.size(); ++k)
      EXPECT_TRUE(torch::equal(read[k].narrow(0, 0, sizes[k]), written[k].narrow(0, 0, sizes[k])))
          << sizes[k] << " bytes";
    const auto c = tier.counters();
    int64_t want_read = 0;
    for (const auto n : sizes) want_read += NvmeTier::aligned(n);
    EXPECT_EQ(c.read_bytes, want_read);
    EXPECT_EQ(c.written_bytes, 2 * want_read);
    // A new file reads as zeros; the files are unlinked at once: nothing is left in the directory.
    const int fresh = tier.add_file("fresh", 8192);
    auto z = aligned_bytes(8192);
    z.fill_(7);
    tier.wait(tier.read(fresh, 0, z.data_ptr(), 8192));
    EXPECT_EQ(z.count_nonzero().item<int64_t>(), 0);
    EXPECT_TRUE(std::filesystem::is_empty(tier.dir()));
  }
}

TEST(NvmeTier, ADirectoryThatCannotBeCreatedIsOneLineNamingTheKey) {
  test::TempDir tmp;
  const std::string file = tmp.file("a-file");
  { std::ofstream(file) << "x"; }
  const std::string why = test::error_of([&] { NvmeTier tier(file + "/under"); });
  EXPECT_NE(why.find("offload.nvme_path"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
}

TEST(NvmeTier, AFileLargerThanTheDiskIsRefusedWhenItIsAdded) {
  test::TempDir tmp;
  NvmeTier tier(tmp.path());
  const std::string why = test::error_of([&] { tier.add_file("huge", int64_t{1} << 60); });
  EXPECT_NE(why.find("offload.nvme_blocks"), std::string::npos) << why;
}

}  // namespace
}  // namespace tandem
