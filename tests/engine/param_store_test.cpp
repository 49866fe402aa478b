// The ParamStore on the CPU device (Note [ParamStore layout], Note [Sharded store]): the flat layout
// and the parameters as views of it, moving Blocks between the sides bit for bit, Blocks kept
// CPU-updated, masters bound for checkpoint code, and a sharded store's state through the whole
// range (two ranks in threads, Gloo on loopback).

#include "tandem/engine/host_states.h"
#include "tandem/engine/param_store.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <map>
#include <stdexcept>
#include <thread>

#include "../test_util.h"
#include "../parallel/comm_threads.h"
#include "engine_fixtures.h"
#include "tandem/engine/offload_engine.h"
#include "tandem/models/model.h"
#include "tandem/models/spec.h"
#include "tandem/parallel/comm.h"

namespace tandem {
namespace {

ModelSpec small_spec() { return test::small_engine_spec(3); }

std::shared_ptr<Model> small_model() { return test::small_engine_model(3); }

// A token batch of the small model: (4, 16) inputs and targets.
std::pair<torch::Tensor, torch::Tensor> batch(int64_t step) {
  torch::manual_seed(1000 + (step % 4) * 7);
  auto t = torch::randint(0, small_spec().vocab_size, {4, 17}, torch::kInt64);
  return {t.narrow(1, 0, 16), t.narrow(1, 1, 16)};
}

const char* ptr(const torch::Tensor& t) { return static_cast<const char*>(t.data_ptr()); }

TEST(ParamStore, LaysEachBlocksParametersEndToEndInForwardOrder) {
  auto model = small_model();
  std::vector<std::vector<NamedTensor>> initial;  // the fp32 weights before the store takes them over
  for (auto& blk : model->blocks()) {
    initial.emplace_back();
    for (auto& [name, p] : blk->hf_parameters()) initial.back().emplace_back(name, p.detach().clone());
  }
  ParamStoreOptions so;
  so.compute_dtype = torch::kBFloat16;
  ParamStore store(*model, so, /*gpu_blocks=*/1);
  ASSERT_EQ(store.blocks().size(), model->blocks().size());
  EXPECT_EQ(store.gpu_blocks(), 1);
  int64_t base = 0;
  for (size_t i = 0; i < store.blocks().size(); ++i) {
    auto& b = store.blocks()[i];
    SCOPED_TRACE(b.name);
    EXPECT_EQ(b.name, model->blocks()[i]->name());
    EXPECT_EQ(b.index_base, base);
    ASSERT_EQ(b.params.size(), initial[i].size());
    int64_t offset = 0;
    for (size_t k = 0; k < b.params.size(); ++k) {
      const auto& f = b.params[k];
      const auto& want = initial[i][k].second;
      EXPECT_EQ(f.name, initial[i][k].first);
      EXPECT_EQ(f.offset, offset);
      EXPECT_EQ(f.numel, want.numel());
      EXPECT_EQ(f.shape, want.sizes().vec());
      EXPECT_EQ(f.weight_decay_scale, want.dim() >= 2 ? 1.0f : 0.0f);
      EXPECT_TRUE(torch::equal(b.master.narrow(0, offset, f.numel).view(want.sizes()), want)) << f.name;
      EXPECT_TRUE(torch::equal(b.working.narrow(0, offset, f.numel).view(want.sizes()), want.to(torch::kBFloat16)));
      EXPECT_EQ(ptr(f.param), ptr(b.working) + offset * 2) << f.name;  // a view of the working copy
      EXPECT_EQ(ptr(f.param.grad()), ptr(b.grad) + offset * 2) << f.name;
      offset += f.numel;
    }
    EXPECT_EQ(b.numel, offset);
    EXPECT_EQ(b.padded_numel, b.numel);  // unsharded: the slice is the whole range
    EXPECT_EQ(b.shard_numel, b.numel);
    EXPECT_EQ(b.shard_params.size(), b.params.size());
    EXPECT_EQ(b.master.scalar_type(), torch::kFloat32);
    EXPECT_EQ(b.m.count_nonzero().item<int64_t>() + b.v.count_nonzero().item<int64_t>(), 0);
    if (i == 0) {  // GPU-updated: no host buffers
      EXPECT_EQ(b.side, UpdateSide::kGpu);
      EXPECT_FALSE(b.landing.defined());
      EXPECT_FALSE(b.undo_master.defined());
    } else {
      EXPECT_EQ(b.side, UpdateSide::kCpu);
      EXPECT_EQ(b.landing.scalar_type(), torch::kBFloat16);  // bf16 gradients come down as they are
      EXPECT_TRUE(torch::equal(b.staging, b.master.to(torch::kBFloat16)));
      EXPECT_EQ(b.undo_master.numel(), b.numel);
    }
    base += b.numel;
  }
}

TEST(ParamStore, ParametersAreViewsOfTheFlatBuffers) {
  auto model = small_model();
  ParamStore store(*model, {}, 0);
  for (auto& b : store.blocks())
    for (auto& f : b.params) {
      const auto* base = static_cast<const char*>(b.working.data_ptr());
      EXPECT_EQ(static_cast<const char*>(f.param.data_ptr()), base + f.offset * b.working.element_size()) << f.name;
      EXPECT_EQ(static_cast<const char*>(f.param.grad().data_ptr()),
                static_cast<const char*>(b.grad.data_ptr()) + f.offset * b.grad.element_size())
          << f.name;
    }
  // A backward accumulates into the flat gradient buffers, not into new tensors.
  auto [in, tgt] = batch(0);
  model->loss(model->forward(in), tgt).backward();
  for (auto& blk : store.blocks())
    for (auto& f : blk.params)
      EXPECT_EQ(f.param.grad().data_ptr(), blk.grad.narrow(0, f.offset, f.numel).data_ptr()) << f.name;
  double total = 0;
  for (auto& blk : store.blocks()) total += blk.grad.abs().sum().item<double>();
  EXPECT_GT(total, 0.0);
}

TEST(ParamStore, AHostRingSharesSlotsTheSizeOfTheLargestBlock) {
  auto model = small_model();
  ParamStoreOptions so;
  so.undo = false;
  so.ring_slots = 2;
  ParamStore store(*model, so, 0);
  int64_t largest = 0;
  for (auto& b : store.blocks()) {
    EXPECT_FALSE(b.landing.defined()) << b.name;
    largest = std::max(largest, b.numel);
  }
  ASSERT_EQ(store.ring().size(), 2u);
  EXPECT_EQ(store.ring()[1].landing.numel(), largest);
  EXPECT_EQ(store.ring()[1].staging.numel(), largest);
  // Block 2's view of slot 1: the slot's first numel elements.
  const auto l = store.landing(2, 1), s = store.staging(2, 1);
  EXPECT_EQ(l.numel(), store.blocks()[2].numel);
  EXPECT_EQ(ptr(l), ptr(store.ring()[1].landing));
  EXPECT_EQ(ptr(s), ptr(store.ring()[1].staging));
}

// Three offload steps through the store, so its masters and states hold realistic values.
void train_three_steps(Model& model, ParamStore& store) {
  OffloadEngine engine(model, store, {});
  for (int step = 0; step < 3; ++step) {
    engine.begin_step(3e-3);
    engine.begin_micro(true);
    auto [in, tgt] = batch(step);
    model.loss(model.forward(in), tgt).backward();
    engine.end_step();
  }
  engine.wait_all();
}

TEST(ParamStore, BlockMigrationKeepsMasterAndStatesBitExact) {
  // fp32 host states, and bf16 ones (widened exactly on the way up, rounded back to the same bits).
  for (const auto state : {torch::kFloat32, torch::kBFloat16}) {
    SCOPED_TRACE(state == torch::kFloat32 ? "fp32 host states" : "bf16 host states");
    auto model = small_model();
    ParamStoreOptions so;
    so.host_state_dtype = state;
    ParamStore store(*model, so, 0);
    train_three_steps(*model, store);
    std::vector<torch::Tensor> before;
    for (auto& b : store.blocks())
      for (auto* t : {&b.master, &b.m, &b.v}) before.push_back(t->clone());
    const auto check = [&](const char* when) {
      size_t k = 0;
      for (auto& b : store.blocks())
        for (auto* t : {&b.master, &b.m, &b.v})
          EXPECT_TRUE(torch::equal(t->to(torch::kCPU), before[k++])) << b.name << " " << when;
    };
    store.set_gpu_blocks(3);
    EXPECT_EQ(store.gpu_blocks(), 3);
    check("after moving to the device side");
    store.set_gpu_blocks(0);
    EXPECT_EQ(store.gpu_blocks(), 0);
    check("after moving back");
    EXPECT_EQ(store.blocks()[0].m.scalar_type(), state);
  }
}

// 8-bit host states (Note [8-bit states]): a Block moved to the device side decodes them into fp32
// states equal to their decoded values, and moved back encodes the same codes and scales.
TEST(ParamStore, EightBitStatesDecodeOnTheWayUpAndEncodeToTheSameCodesOnTheWayBack) {
  auto model = small_model();
  ParamStoreOptions so;
  so.host_state_dtype = torch::kInt8;
  ParamStore store(*model, so, 0);
  train_three_steps(*model, store);
  auto& b = store.blocks()[1];
  ASSERT_EQ(b.m.scalar_type(), torch::kInt8);
  ASSERT_EQ(b.v.scalar_type(), torch::kUInt8);
  EXPECT_EQ(b.m_scale.numel(), b.v_scale.numel());
  EXPECT_GT(b.m_scale.abs().max().item<float>(), 0.0f);  // the updates wrote codes and scales
  const auto codes_m = b.m.clone(), codes_v = b.v.clone(), sm = b.m_scale.clone(), sv = b.v_scale.clone();
  const auto [m32, v32] = states_f32(b);
  store.move_block(1, UpdateSide::kGpu);
  EXPECT_EQ(b.m.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(b.m.cpu(), m32));
  EXPECT_TRUE(torch::equal(b.v.cpu(), v32));
  store.move_block(1, UpdateSide::kCpu);
  EXPECT_TRUE(torch::equal(b.m, codes_m));
  EXPECT_TRUE(torch::equal(b.v, codes_v));
  EXPECT_TRUE(torch::equal(b.m_scale, sm));
  EXPECT_TRUE(torch::equal(b.v_scale, sv));
  // param_state decodes; load_param_state encodes a parameter's moments back into the Block.
  const auto& f = b.params[0];
  auto st = store.param_state(f.param);
  EXPECT_TRUE(torch::equal(st[1].reshape(-1), m32.narrow(0, f.offset, f.numel)));
  store.load_param_state(f.param, st[0], st[1] * 2, st[2]);
  EXPECT_TRUE(torch::allclose(store.param_state(f.param)[1], st[1] * 2, 0.07, 0));
  EXPECT_TRUE(torch::equal(b.v, codes_v));
}

// Note [bf16 master]: the host master in bf16 (with its compensation for Kahan) widens to fp32 on
// the way to the device side and comes back with the same value; param_state reads it in fp32,
// load_param_state writes it; checkpoint code sees the bf16 master, and a Kahan master's
// compensation is among the state's names.
TEST(ParamStore, ABf16MasterWidensOnTheWayUpAndComesBackWithTheSameValue) {
  for (const auto kind : {MasterKind::kBf16Stochastic, MasterKind::kBf16Kahan}) {
    const bool kahan = kind == MasterKind::kBf16Kahan;
    SCOPED_TRACE(kahan ? "kahan" : "stochastic");
    auto model = small_model();
    ParamStoreOptions so;
    so.host_master = kind;
    so.host_state_dtype = torch::kInt8;
    ParamStore store(*model, so, 0);
    auto& b = store.blocks()[1];
    ASSERT_EQ(b.master.scalar_type(), torch::kBFloat16);
    EXPECT_EQ(b.master_comp.defined(), kahan);
    const auto initial = master_f32(b);
    train_three_steps(*model, store);
    const auto w = master_f32(b);
    const auto hi = b.master.clone(), lo = kahan ? b.master_comp.clone() : torch::Tensor();
    EXPECT_FALSE(torch::equal(w, initial)) << "the updates did not reach the master";
    EXPECT_TRUE(torch::equal(b.working.narrow(0, 0, b.numel), b.master.narrow(0, 0, b.numel).to(b.working.dtype())))
        << "the device copy is the master's bf16 value";
    store.move_block(1, UpdateSide::kGpu);
    EXPECT_EQ(b.master.scalar_type(), torch::kFloat32);
    EXPECT_FALSE(b.master_comp.defined());
    EXPECT_TRUE(torch::equal(b.master.cpu(), w));
    store.move_block(1, UpdateSide::kCpu);
    ASSERT_EQ(b.master.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(b.master, hi)) << "the pair the updates left, bit for bit";
    if (kahan) {
      EXPECT_TRUE(torch::equal(b.master_comp, lo));
    }
    // The Python optimizer's view: the fp32 value, and a new one written back.
    const auto& f = b.params[0];
    auto st = store.param_state(f.param);
    EXPECT_EQ(st[0].scalar_type(), torch::kFloat32);
    EXPECT_TRUE(torch::equal(st[0].reshape(-1), w.narrow(0, f.offset, f.numel)));
    const auto moved = st[0] + 1e-3;
    store.load_param_state(f.param, moved, st[1], st[2]);
    const auto back = store.param_state(f.param)[0];
    EXPECT_TRUE(torch::allclose(back, moved, kahan ? 1e-5 : 4e-3, 0));
    EXPECT_TRUE(torch::equal(f.param.detach().reshape(-1).to(torch::kFloat32),
                             b.master.narrow(0, f.offset, f.numel).to(torch::kFloat32)))
        << "the working copy follows the new master";
    // Checkpoint code binds the bf16 master itself; state() names a Kahan master's compensation.
    store.with_masters_bound([&] { EXPECT_EQ(f.param.scalar_type(), torch::kBFloat16); });
    bool named = false;
    for (const auto& [name, t] : store.state(torch::zeros({})))
      if (name == f.name + ".master_comp") named = true;
    EXPECT_EQ(named, kahan);
  }
}

TEST(ParamStore, MoveBlockChangesOneBlocksSideAndItsBuffers) {
  auto model = small_model();
  ParamStoreOptions so;
  so.host_state_dtype = torch::kBFloat16;
  ParamStore store(*model, so, 0);
  auto& b = store.blocks()[2];
  const auto master = b.master.clone();
  store.move_block(2, UpdateSide::kGpu);
  EXPECT_EQ(b.side, UpdateSide::kGpu);
  EXPECT_EQ(store.gpu_blocks(), 1);
  EXPECT_EQ(b.m.scalar_type(), torch::kFloat32);  // GPU-updated Blocks keep fp32 states
  EXPECT_TRUE(torch::equal(b.master, master));
  store.move_block(2, UpdateSide::kGpu);  // already there: nothing changes
  EXPECT_EQ(store.gpu_blocks(), 1);
  store.move_block(2, UpdateSide::kCpu);
  EXPECT_EQ(b.side, UpdateSide::kCpu);
  EXPECT_EQ(b.m.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(b.master, master));
  EXPECT_EQ(store.gpu_blocks(), 0);
}

TEST(ParamStore, BlocksKeptCpuUpdatedAreSkippedByTheSplit) {
  auto model = small_model();
  ParamStore store(*model, {}, 2);  // embed and layer.0 GPU-updated
  const size_t n = store.blocks().size();
  std::vector<bool> keep(n, false);
  keep[1] = keep[2] = true;  // layer.0 and layer.1
  store.keep_cpu_updated(keep);
  EXPECT_EQ(store.blocks()[1].side, UpdateSide::kCpu) << "a kept Block that was GPU-updated moves back";
  EXPECT_EQ(store.gpu_blocks(), 1);
  store.set_gpu_blocks(3);  // the first 3 Blocks that are not kept: embed, layer.2, head
  std::vector<UpdateSide> want(n, UpdateSide::kCpu);
  want[0] = want[3] = want[4] = UpdateSide::kGpu;
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(store.blocks()[i].side, want[i]) << store.blocks()[i].name;
  EXPECT_EQ(store.gpu_blocks(), 3);
}

TEST(ParamStore, MastersBoundForCheckpointCodeThenTheWorkingCopiesFollow) {
  auto model = small_model();
  ParamStoreOptions so;
  so.compute_dtype = torch::kBFloat16;
  ParamStore store(*model, so, 1);
  auto& b = store.blocks()[1];
  auto& f = b.params[0];
  store.with_masters_bound([&] {
    // Inside: the parameters are fp32 views of the masters, on their update side.
    EXPECT_EQ(f.param.scalar_type(), torch::kFloat32);
    EXPECT_EQ(ptr(f.param), ptr(b.master) + f.offset * 4);
    torch::NoGradGuard ng;
    f.param.fill_(0.3);  // what loading a checkpoint does
  });
  // After: bound to the working copy again, which (and the staging copy) holds the new master.
  EXPECT_EQ(ptr(f.param), ptr(b.working) + f.offset * 2);
  EXPECT_TRUE(torch::equal(b.master.narrow(0, f.offset, f.numel), torch::full({f.numel}, 0.3f)));
  EXPECT_TRUE(torch::equal(b.working, b.master.to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(b.staging, b.master.to(torch::kBFloat16)));
  // A failure inside still leaves the parameters bound to the working copies.
  EXPECT_THROW(store.with_masters_bound([] { throw std::runtime_error("bad file"); }), std::runtime_error);
  EXPECT_EQ(ptr(f.param), ptr(b.working) + f.offset * 2);
}

TEST(ParamStore, StateNamesEveryParametersMomentsAsViews) {
  auto model = small_model();
  ParamStore store(*model, {}, 0);
  const auto step = torch::full({}, 5.0f);
  const auto st = store.state(step);
  size_t k = 0;
  for (auto& b : store.blocks())
    for (auto& f : b.params) {
      ASSERT_LT(k + 2, st.size());
      EXPECT_EQ(st[k].first, f.name + ".exp_avg");
      EXPECT_EQ(ptr(st[k].second), ptr(b.m) + f.offset * 4);
      EXPECT_EQ(st[k].second.sizes().vec(), f.shape);
      EXPECT_EQ(st[k + 1].first, f.name + ".exp_avg_sq");
      EXPECT_EQ(ptr(st[k + 1].second), ptr(b.v) + f.offset * 4);
      EXPECT_EQ(st[k + 2].first, f.name + ".step");
      EXPECT_EQ(st[k + 2].second.item<float>(), 5.0f);
      k += 3;
    }
  EXPECT_EQ(k, st.size());
}

// A port no one listens on now.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("no free port");
  ::close(fd);
  return ntohs(a.sin_port);
}

// Element j of Block `block`'s whole range of `kind` in the round trip below.
torch::Tensor whole_range(size_t block, const std::string& kind, int64_t offset, int64_t n) {
  const double k = kind == "master" ? 0.0 : kind == "exp_avg" ? 1.0 : 2.0;
  return (torch::arange(offset, offset + n, torch::kFloat64) * 1e-3 + 10.0 * double(block) + k).to(torch::kFloat32);
}

// One rank of two sharing the store (Note [Sharded store]): loads the whole ranges, checks its slices.
// A bf16 master (Note [bf16 master]) holds the masters rounded to bf16, and writes them out in fp32.
void sharded_rank(Comm& comm, MasterKind master) {
  const int rank = comm.rank();
  auto model = small_model();
  ParamStoreOptions so;
  so.shard_rank = rank;
  so.shard_count = 2;
  so.comm = &comm;
  so.host_master = master;
  ParamStore store(*model, so, 0);
  const auto expected = [&](size_t block, const std::string& kind, int64_t offset, int64_t n) {
    const auto t = whole_range(block, kind, offset, n);
    return kind == "master" && master != MasterKind::kFp32 ? t.to(torch::kBFloat16).to(torch::kFloat32) : t;
  };
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < store.blocks().size(); ++i) index[store.blocks()[i].name] = i;
  store.load_shard_state([&](const std::string& name, const std::string& kind, int64_t offset, int64_t n,
                             torch::Tensor out) { out.copy_(whole_range(index.at(name), kind, offset, n)); });
  const auto st = store.shard_state();
  ASSERT_EQ(st.size(), 3 * store.blocks().size());
  for (size_t i = 0; i < store.blocks().size(); ++i) {
    const auto& b = store.blocks()[i];
    EXPECT_EQ(b.shard_offset, rank * b.shard_numel);
    EXPECT_EQ(b.padded_numel, 2 * b.shard_numel);
    const int64_t real = std::max<int64_t>(0, std::min(b.shard_numel, b.numel - b.shard_offset));
    const char* kinds[] = {"master", "exp_avg", "exp_avg_sq"};
    for (int k = 0; k < 3; ++k) {
      const auto& [name, t] = st[3 * i + k];
      EXPECT_EQ(name, b.name + "." + kinds[k]);
      EXPECT_EQ(t.scalar_type(), torch::kFloat32) << name;
      EXPECT_TRUE(torch::equal(t.narrow(0, 0, real), expected(i, kinds[k], b.shard_offset, real))) << name;
      EXPECT_EQ(t.narrow(0, real, b.shard_numel - real).count_nonzero().item<int64_t>(), 0) << name << " padding";
    }
    // The working copy is whole on every rank: both slices, gathered.
    EXPECT_TRUE(torch::equal(b.working.narrow(0, 0, b.numel), expected(i, "master", 0, b.numel))) << b.name;
  }
}

TEST(ParamStore, AShardedStoresStateRoundTripsThroughTheWholeRange) {
  for (const auto master : {MasterKind::kFp32, MasterKind::kBf16Stochastic}) {
    SCOPED_TRACE(master == MasterKind::kFp32 ? "fp32 master" : "bf16 master");
    // The ranks' Comms outlive both bodies, rank 0's (the store's server) last: a rank that is done
    // first must not take the store from the other.
    const auto errors = test::on_ranks(2, 1, free_port(), [&](Comm& comm) { sharded_rank(comm, master); });
    if (errors[0].find("no Gloo headers") != std::string::npos) GTEST_SKIP() << errors[0];
    test::expect_no_errors(errors);
  }
}

}  // namespace
}  // namespace tandem
