#include "tandem/parallel/comm.h"

#ifdef TANDEM_WITH_GLOO
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

#include <algorithm>
#include <cstdlib>
#include <map>
#include <utility>

#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/parallel/strict_p2p.h"

namespace tandem {

// Note [Process groups]
// Rank 0 serves the TCPStore; every rank connects to it (the rendezvous waits for all of them up to
// CommOptions::timeout). On top of it: one Gloo group for host tensors (the step loop's small
// agreements: norms, the update split, balance measurements) and two groups for the training
// device's tensors, NCCL on CUDA and Gloo on the CPU. c10d requires every rank to issue a group's
// collectives in the same order. The step loop reduces gradients while the CPU updater thread
// gathers updated weights, and the two threads interleave differently on each rank, so each thread
// has its own group (lane 0: the step loop; lane 1: the updater), each under its own store prefix.
// Gloo binds to GLOO_SOCKET_IFNAME when set, to loopback when MASTER_ADDR is local, otherwise to
// the address the host name resolves to (c10d's default). A pipeline-parallel run (Note [Pipeline
// parallel]) adds, per stage, the two lanes over that stage's replicas (the data-parallel reductions)
// and one world group for the stages' point-to-point traffic, each under its own prefix.
//
// Note [Stalled ranks]
// A rank can hang with its heartbeat alive: a collective one rank never reached, two ranks each
// waiting for the other, a GPU that stopped progressing. Then NCCL's watchdog would abort every
// rank after the collective timeout with pages of stack traces. Instead the step loop marks where
// it waits (Comm::Waiting: a stage link's receive, the step's end, a host collective), the
// heartbeat thread reads the mark, and a wait longer than dist.timeout_s while every rank still
// beats ends the rank with one line naming the rank, what it waited for, for how long, and how the
// run continues (exit kExitPeerLost: the launcher restarts it). The collectives' own timeouts are
// a grace period longer, so this line comes first. When a peer is lost, the same mark says what
// this rank was waiting for.
namespace {
constexpr auto kCollectiveGrace = std::chrono::seconds(60);
}  // namespace

// Note [Heartbeat]
// Collectives with a dead peer fail fast on Gloo (the connection closes) and NCCL's watchdog
// aborts on its timeout, but a hung rank (stopped, deadlocked, a wedged GPU) holds the others
// until the collective timeout. So each rank adds to "hb/<rank>" in the store every heartbeat_s
// from a thread with its own store connection, and reads everyone's counter; a counter that has
// not moved for heartbeat_timeout_s, or a store that stops answering (rank 0 is gone), means the
// run has lost a rank. The default reaction logs it and ends the process with kExitPeerLost (75):
// the step loop may be blocked inside a collective with that rank and cannot be unwound, and
// nothing more can be saved without it; the launcher then restarts every rank from the newest
// intact checkpoint.

namespace {
[[maybe_unused]] constexpr const char* kNoGloo =
    "this build of tandem has no Gloo headers, so it cannot run several processes; install libgloo-dev "
    "(scripts/setup.sh does) and rebuild";
}  // namespace

// Note [Flight recorder]
// c10d records each collective of every group in one process-wide flight recorder (2000 entries
// unless TORCH_FR_BUFFER_SIZE says otherwise). LibTorch 2.11 enters a group into the recorder's map
// of groups outside the recorder's lock, so two groups whose first collectives start at once on two
// threads (lane 0 and lane 1, Note [Process groups]; or ranks as threads in the tests) can corrupt
// that map and end the process with a segmentation fault. tandem names its own waits (Note [Stalled
// ranks]), so before its first group it turns the recorder off, unless the user set
// TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE (then the race is theirs to take).
void keep_flight_recorder_off() {
  static const bool once = [] {
    if (std::getenv("TORCH_FR_BUFFER_SIZE") == nullptr && std::getenv("TORCH_NCCL_TRACE_BUFFER_SIZE") == nullptr)
      ::setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0);
    return true;
  }();
  (void)once;
}

c10::intrusive_ptr<c10d::Backend> make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, const RankInfo& info,
                                                  std::chrono::milliseconds timeout) {
#ifndef TANDEM_WITH_GLOO
  TANDEM_FAIL(kNoGloo);
#else
  keep_flight_recorder_off();
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0') {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else if (info.master_addr == "127.0.0.1" || info.master_addr == "localhost" || info.master_addr == "::1" ||
             info.world_size == info.local_world_size) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, info.rank, info.world_size, opts);
#endif
}

Comm::Comm(const RankInfo& info, CommOptions options) : info_(info), options_(std::move(options)) {
#ifndef TANDEM_WITH_GLOO
  TANDEM_FAIL(kNoGloo);
#else
  keep_flight_recorder_off();  // before any thread of this process records (Note [Flight recorder])
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(info_.master_port);
  so.isServer = info_.rank == 0;
  so.numWorkers = static_cast<size_t>(info_.world_size);
  so.waitWorkers = true;
  so.timeout = options_.timeout;
  try {
    store_ = c10::make_intrusive<c10d::TCPStore>(info_.master_addr, so);
  } catch (const std::exception& e) {
    TANDEM_FAIL(
        "rank ", info_.rank, " of ", info_.world_size, " could not meet the others at ", info_.master_addr, ":",
        info_.master_port, " (", one_line(e.what()),
        "); check MASTER_ADDR/MASTER_PORT, that the port is free on rank 0's host, and that every rank started");
  }
  const auto collective_timeout = options_.timeout + kCollectiveGrace;  // Note [Stalled ranks]
  host_ = make_gloo_group(c10::make_intrusive<c10d::PrefixStore>("host", store_), info_, collective_timeout);
  for (int lane = 0; lane < 2; ++lane) {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("device" + std::to_string(lane), store_);
    device_.push_back(options_.nccl ? make_nccl_group(prefixed, info_.rank, info_.world_size, options_.cuda_device,
                                                      collective_timeout)
                                    : make_gloo_group(prefixed, info_, collective_timeout));
  }
  replica_ = device_;
  if (options_.heartbeat_s > 0) {
    hb_store_ = store_->clone();
    hb_store_->add("hb/" + std::to_string(info_.rank), 1);
    heartbeat_ = std::thread([this] { heartbeat_loop(); });
  }
#endif
}

Comm::~Comm() { stop_heartbeat(); }

void Comm::stop_heartbeat() {
  stop_ = true;
  if (heartbeat_.joinable()) heartbeat_.join();
}

c10d::Backend& Comm::device_group(int lane) {
  TANDEM_ASSERT(lane >= 0 && lane < static_cast<int>(replica_.size()), "lane ", lane);
  return *replica_[static_cast<size_t>(lane)];
}

c10d::Backend& Comm::world_device_group() { return *device_.at(0); }

c10d::Backend& Comm::stage_link(Link direction) {
  TANDEM_ASSERT(links_.size() == 2, "no pipeline: dist.pipeline_stages=1");
  return *links_[direction == Link::kDown ? 0 : 1];
}

void Comm::split_pipeline(int stages) {
#ifdef TANDEM_WITH_GLOO
  TANDEM_ASSERT(stages_ == 1 && stages >= 1 && info_.world_size % stages == 0, "pipeline split ", stages, " of ",
                info_.world_size);
  if (stages == 1) return;
  stages_ = stages;
  const int stage = info_.rank / replicas();
  RankInfo sub = info_;
  sub.rank = replica();
  sub.world_size = replicas();
  for (int lane = 0; lane < 2; ++lane) {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(
        "stage" + std::to_string(stage) + "/device" + std::to_string(lane), store_);
    replica_[static_cast<size_t>(lane)] =
        options_.nccl ? make_nccl_group(prefixed, sub.rank, sub.world_size, options_.cuda_device,
                                        options_.timeout + kCollectiveGrace)
                      : make_gloo_group(prefixed, sub, options_.timeout + kCollectiveGrace);
  }
  // Note [Stage links]: a group per direction. Note [Strict point to point]: without NCCL they keep
  // NCCL's semantics all the same.
  for (const std::string name : {"link-down", "link-up"}) {
    const auto prefixed = c10::make_intrusive<c10d::PrefixStore>(name, store_);
    links_.push_back(options_.nccl
                         ? make_nccl_group(prefixed, info_.rank, info_.world_size, options_.cuda_device,
                                           options_.timeout + kCollectiveGrace)
                         : make_strict_p2p(make_gloo_group(prefixed, info_, options_.timeout + kCollectiveGrace),
                                           c10::make_intrusive<c10d::PrefixStore>(name + "/p2p", store_),
                                           options_.timeout + kCollectiveGrace));
  }
#endif
}

void Comm::heartbeat_loop() {
  using Clock = std::chrono::steady_clock;
  const std::string mine = "hb/" + std::to_string(info_.rank);
  std::map<int, std::pair<int64_t, Clock::time_point>> seen;  // rank -> last counter, when it last moved
  bool lost = false;
  Clock::time_point lost_at;
  auto next = Clock::now();
  while (!stop_) {
    next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.heartbeat_s));
    while (!stop_ && Clock::now() < next) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (stop_) return;
    if (lost) {
      // The reaction ran and the process is still here: end it (Note [Heartbeat]).
      if (Clock::now() - lost_at > std::chrono::duration<double>(options_.heartbeat_timeout_s))
        std::_Exit(kExitPeerLost);
      continue;
    }
    std::string why;
    bool stalled = false;
    try {
      hb_store_->add(mine, 1);
      const auto now = Clock::now();
      for (int r = 0; r < info_.world_size && why.empty(); ++r) {
        if (r == info_.rank) continue;
        const std::string key = "hb/" + std::to_string(r);
        const int64_t v = hb_store_->check({key}) ? hb_store_->add(key, 0) : 0;
        auto it = seen.find(r);
        if (it == seen.end() || it->second.first != v) {
          seen[r] = {v, now};
        } else if (now - it->second.second > std::chrono::duration<double>(options_.heartbeat_timeout_s)) {
          why = strprintf("rank %d has not sent a heartbeat for %.0f s: it died or hangs", r,
                          std::chrono::duration<double>(now - it->second.second).count());
        }
      }
    } catch (const std::exception& e) {
      why = strprintf("rank 0 stopped (the rendezvous store it serves at %s:%d stopped answering: %s)",
                      info_.master_addr.c_str(), info_.master_port, one_line(e.what()).substr(0, 120).c_str());
    }
    const auto [what, waited] = current_wait();
    if (why.empty() && !what.empty() && waited > std::chrono::duration<double>(options_.timeout).count()) {
      stalled = true;  // Note [Stalled ranks]
      why = strprintf(
          "waited %.0f s for %s while every rank still sends heartbeats: the ranks wait for each other (a collective "
          "one rank never reached) or a GPU stopped progressing",
          waited, what.c_str());
    } else if (!why.empty() && !what.empty()) {
      why += strprintf(" (this rank waited %.0f s for %s)", waited, what.c_str());
    }
    if (why.empty()) continue;
    lost = true;
    lost_at = Clock::now();
    if (options_.on_peer_lost) {
      options_.on_peer_lost(why);
    } else {
      std::string run_dir;
      {
        std::lock_guard<std::mutex> lk(wait_mu_);
        run_dir = run_dir_;
      }
      log::error(strprintf("rank %d: %s; stopping (exit %d): %s%s", info_.rank, why.c_str(), kExitPeerLost,
                           how_the_run_continues(info_, run_dir).c_str(),
                           stalled ? "; if it happens again, rerun with NCCL_DEBUG=WARN and report every rank's last "
                                     "lines"
                                   : ""));
      std::_Exit(kExitPeerLost);
    }
  }
}

Comm::Waiting::Waiting(Comm* comm, std::string what) : comm_(comm) {
  if (!comm_) return;
  std::lock_guard<std::mutex> lk(comm_->wait_mu_);
  outer_ = std::exchange(comm_->waiting_, std::move(what));
  comm_->waiting_since_ = std::chrono::steady_clock::now();
}

Comm::Waiting::~Waiting() {
  if (!comm_) return;
  std::lock_guard<std::mutex> lk(comm_->wait_mu_);
  comm_->waiting_ = std::move(outer_);
  comm_->waiting_since_ = std::chrono::steady_clock::now();
}

void Comm::set_run_dir(const std::string& dir) {
  std::lock_guard<std::mutex> lk(wait_mu_);
  run_dir_ = dir;
}

std::pair<std::string, double> Comm::current_wait() {
  std::lock_guard<std::mutex> lk(wait_mu_);
  return {waiting_, std::chrono::duration<double>(std::chrono::steady_clock::now() - waiting_since_).count()};
}

int Comm::find_lost_rank() {
  if (options_.heartbeat_s <= 0 || info_.world_size < 2) return -1;
  try {
    const auto counters = [&] {
      std::vector<int64_t> v(static_cast<size_t>(info_.world_size), 0);
      for (int r = 0; r < info_.world_size; ++r) {
        const std::string key = "hb/" + std::to_string(r);
        if (store_->check({key})) v[static_cast<size_t>(r)] = store_->add(key, 0);
      }
      return v;
    };
    const auto before = counters();
    std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.5, 2.5 * options_.heartbeat_s)));
    const auto after = counters();
    for (int r = 0; r < info_.world_size; ++r)
      if (r != info_.rank && before[static_cast<size_t>(r)] == after[static_cast<size_t>(r)]) return r;
    return -1;
  } catch (const std::exception&) {
    return 0;  // the store is rank 0's
  }
}

void Comm::check_same(const std::string& what, const std::string& value, const std::string& fix) {
  const std::string prefix = "same/" + what + "/" + std::to_string(store_calls_["same/" + what]++) + "/";
  store_->set(prefix + std::to_string(info_.rank), std::vector<uint8_t>(value.begin(), value.end()));
  std::vector<std::string> values;
  for (int r = 0; r < info_.world_size; ++r) {
    const auto v = store_->get(prefix + std::to_string(r));
    values.emplace_back(v.begin(), v.end());
  }
  for (int r = 1; r < info_.world_size; ++r) {
    if (values[static_cast<size_t>(r)] == values[0]) continue;
    std::string all;
    for (int q = 0; q < info_.world_size; ++q)
      all += strprintf("%srank %d: %s", q ? ", " : "", q, values[static_cast<size_t>(q)].c_str());
    TANDEM_FAIL("the ranks run different ", what, " (", all, "); ", fix);
  }
}

std::string Comm::broadcast_string(const std::string& key, const std::string& value) {
  const std::string name = "bcast/" + key + "/" + std::to_string(store_calls_["bcast/" + key]++);
  if (info_.rank == 0) store_->set(name, std::vector<uint8_t>(value.begin(), value.end()));
  const auto v = store_->get(name);
  return std::string(v.begin(), v.end());
}

std::vector<double> Comm::from_rank0(const std::vector<double>& values) {
  const Waiting waiting(this, "rank 0's values (a host broadcast)");
  std::vector<at::Tensor> t{torch::tensor(values, torch::kFloat64)};
  host_->broadcast(t)->wait();  // root 0
  return std::vector<double>(t[0].data_ptr<double>(), t[0].data_ptr<double>() + t[0].numel());
}

double Comm::from_stage_first(double value) {
  if (stages_ == 1) return from_rank0({value})[0];
  const auto all = all_gather(value);  // stage-major ranks (Note [Pipeline parallel])
  return all[static_cast<size_t>(info_.rank / replicas() * replicas())];
}

std::vector<double> Comm::all_gather(double value) { return all_gather(std::vector<double>{value}); }

std::vector<double> Comm::all_gather(const std::vector<double>& values) {
  const Waiting waiting(this, "every rank's values (a host all-gather)");
  auto in = torch::tensor(values, torch::kFloat64);
  auto out = torch::empty({world() * static_cast<int64_t>(values.size())}, torch::kFloat64);
  host_->_allgather_base(out, in)->wait();
  return std::vector<double>(out.data_ptr<double>(), out.data_ptr<double>() + out.numel());
}

double Comm::sum(double value) {
  const Waiting waiting(this, "a sum over the ranks (a host all-reduce)");
  std::vector<at::Tensor> t{torch::full({1}, value, torch::kFloat64)};
  host_->allreduce(t)->wait();
  return t[0].item<double>();
}

std::vector<double> Comm::sum(const std::vector<double>& values) {
  const Waiting waiting(this, "a sum over the ranks (a host all-reduce)");
  std::vector<at::Tensor> t{torch::tensor(values, torch::kFloat64)};
  host_->allreduce(t)->wait();
  return std::vector<double>(t[0].data_ptr<double>(), t[0].data_ptr<double>() + t[0].numel());
}

void Comm::send_host(const torch::Tensor& t, int peer, int tag) {
  std::vector<at::Tensor> v{t};
  host_->send(v, peer, tag)->wait();
}

void Comm::recv_host(torch::Tensor& t, int peer, int tag) {
  std::vector<at::Tensor> v{t};
  host_->recv(v, peer, tag)->wait();
}

void Comm::barrier() {
  const Waiting waiting(this, "every rank at a barrier");
  std::vector<at::Tensor> t{torch::zeros({1}, torch::kFloat32)};
  host_->allreduce(t)->wait();
}

}  // namespace tandem
