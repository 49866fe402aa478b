#include <gtest/gtest.h>

#include <map>

#include "tandem/core/error.h"
#include "tandem/parallel/rank_info.h"

namespace tandem {
namespace {

EnvLookup env_of(std::map<std::string, std::string> m) {
  return [m](const std::string& k) -> std::optional<std::string> {
    auto it = m.find(k);
    if (it == m.end()) return std::nullopt;
    return it->second;
  };
}

TEST(RankInfo, NoLauncherIsOneProcess) {
  const RankInfo r = discover_rank(env_of({{"HOME", "/root"}}));
  EXPECT_FALSE(r.distributed());
  EXPECT_EQ(r.world_size, 1);
  EXPECT_EQ(r.source, "single process");
}

TEST(RankInfo, ReadsTheTorchrunContract) {
  const RankInfo r = discover_rank(env_of({{"RANK", "5"},
                                           {"WORLD_SIZE", "8"},
                                           {"LOCAL_RANK", "1"},
                                           {"LOCAL_WORLD_SIZE", "4"},
                                           {"MASTER_ADDR", "node7"},
                                           {"MASTER_PORT", "29777"},
                                           {"TORCHELASTIC_RESTART_COUNT", "2"},
                                           {"TANDEM_DEVICE_INDEX", "3"}}));
  EXPECT_EQ(r.source, "torchrun");
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.world_size, 8);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 4);
  EXPECT_EQ(r.master_addr, "node7");
  EXPECT_EQ(r.master_port, 29777);
  EXPECT_EQ(r.restart_count, 2);
  EXPECT_EQ(r.gpu(), 3);  // the launcher's slot wins over the local rank
}

TEST(RankInfo, ReadsSlurmWithTheFirstNodeAsMaster) {
  const RankInfo r = discover_rank(env_of({{"SLURM_PROCID", "3"},
                                           {"SLURM_NTASKS", "4"},
                                           {"SLURM_LOCALID", "1"},
                                           {"SLURM_NTASKS_PER_NODE", "2(x2)"},
                                           {"SLURM_NODELIST", "gpu[07-08]"}}));
  EXPECT_EQ(r.source, "SLURM");
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.world_size, 4);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 2);
  EXPECT_EQ(r.master_addr, "gpu07");
  EXPECT_EQ(r.gpu(), 1);
}

TEST(RankInfo, ReadsOpenMpi) {
  const RankInfo r = discover_rank(env_of({{"OMPI_COMM_WORLD_RANK", "2"},
                                           {"OMPI_COMM_WORLD_SIZE", "3"},
                                           {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}}));
  EXPECT_EQ(r.source, "Open MPI");
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.world_size, 3);
  EXPECT_EQ(r.local_world_size, 3);
}

TEST(RankInfo, RefusesIncompleteOrImpossibleContracts) {
  const auto error = [](std::map<std::string, std::string> m) {
    try {
      discover_rank(env_of(std::move(m)));
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error({{"RANK", "0"}}).find("WORLD_SIZE is not set"), std::string::npos);
  EXPECT_NE(error({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("not below the world size"), std::string::npos);
  EXPECT_NE(error({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK='x'"), std::string::npos);
  EXPECT_NE(error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "0"}}).find("MASTER_PORT"), std::string::npos);
}

TEST(RankInfo, FirstSlurmHost) {
  EXPECT_EQ(first_slurm_host("node01"), "node01");
  EXPECT_EQ(first_slurm_host("a,b"), "a");
  EXPECT_EQ(first_slurm_host("node[03-05,9],gpu1"), "node03");
  EXPECT_EQ(first_slurm_host("rack1-n[2,4]-ib"), "rack1-n2-ib");
}

}  // namespace
}  // namespace tandem
