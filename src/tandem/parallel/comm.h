#pragma once
// The processes of a run meet through c10d: a TCPStore on MASTER_ADDR:MASTER_PORT (served by
// rank 0), Gloo process groups for CPU tensors and NCCL ones for GPU tensors (Note [Process
// groups]). A heartbeat in the store finds a rank that died or hangs (Note [Heartbeat]).

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tandem/parallel/rank_info.h"

namespace tandem {

/// How the processes meet and watch each other.
struct CommOptions {
  /// The rendezvous, and the longest the step loop may wait in one place while every rank still
  /// beats (Note [Stalled ranks]); the collectives themselves time out a grace period later, so
  /// that this rank's own line comes first.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  bool nccl = false;                  ///< NCCL groups for device tensors (CUDA); Gloo otherwise
  int cuda_device = -1;               ///< this rank's GPU (NCCL)
  double heartbeat_s = 2.0;           ///< period of this rank's heartbeat in the store; 0 = no heartbeat
  double heartbeat_timeout_s = 60.0;  ///< a rank silent this long is lost (Note [Heartbeat])
  /// Called once, from the heartbeat thread, when a rank is lost; the default logs and ends the
  /// process with kExitPeerLost after `heartbeat_timeout_s` more seconds if it is still running.
  std::function<void(const std::string& why)> on_peer_lost;
};

/// Exit code of a process whose peer was lost: the launcher restarts the run.
inline constexpr int kExitPeerLost = 75;

/// A collective failed because another rank of the run stopped (died, was killed, or left); the
/// message names the rank and how the run continues. The CLI exits with kExitPeerLost.
class PeerLostError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The communication context of a multi-process run.
class Comm {
 public:
  /// The rendezvous: blocks until every rank has arrived (or the timeout), then builds the groups.
  Comm(const RankInfo& info, CommOptions options);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return info_.rank; }
  int world() const { return info_.world_size; }
  const RankInfo& info() const { return info_; }
  bool nccl() const { return options_.nccl; }
  c10d::Store& store() { return *store_; }

  /// Collectives over the training device's tensors (NCCL for CUDA, Gloo for CPU) among the
  /// data-parallel replicas of this rank's pipeline stage (the whole world without a pipeline).
  /// Lane 0 is the step loop's, lane 1 the CPU updater thread's: each group sees its collectives in
  /// one order on every rank, whichever thread runs first (Note [Process groups]).
  c10d::Backend& device_group(int lane);
  /// The same over the whole world (lane 0's thread): the pipeline's global norm.
  c10d::Backend& world_device_group();
  /// Point-to-point between pipeline stages, one group per direction (Note [Stage links]): kDown
  /// carries activations to the next stage, kUp their gradients back; NCCL between GPUs, otherwise
  /// Gloo with NCCL's semantics (Note [Strict point to point]); world ranks. Only with
  /// pipeline_stages > 1.
  enum class Link { kDown, kUp };
  c10d::Backend& stage_link(Link direction);
  /// Ranks in device_group(): the world without a pipeline, else the stage's replicas.
  int stages() const { return stages_; }
  int replicas() const { return info_.world_size / stages_; }
  int replica() const { return info_.rank % replicas(); }
  /// Every rank at once: splits the world into `stages` pipeline stages of world / stages replicas
  /// (Note [Pipeline parallel]): device_group() becomes the stage's replicas' and the stage links exist.
  void split_pipeline(int stages);

  /// Every rank publishes `value`; when the ranks disagree each throws UserError naming `what`, the
  /// values per rank and `fix`. Each call has keys of its own (a second check of one `what` never
  /// reads the first's values), so every rank makes the same calls in the same order.
  void check_same(const std::string& what, const std::string& value, const std::string& fix);
  /// Rank 0's `value` on every rank (through the store under `key`, the call's own as check_same's).
  std::string broadcast_string(const std::string& key, const std::string& value);
  /// Rank 0's values on every rank (Gloo broadcast).
  std::vector<double> from_rank0(const std::vector<double>& values);
  /// Every rank at once: the value of this rank's pipeline stage's first replica (rank 0's without a
  /// pipeline). A stage's replicas must agree Block for Block; stages hold different Blocks.
  double from_stage_first(double value);
  /// Every rank's value, in rank order (Gloo).
  std::vector<double> all_gather(double value);
  /// Every rank's `values` (the same count on each), rank after rank (Gloo, one collective).
  std::vector<double> all_gather(const std::vector<double>& values);
  /// The sum over ranks (Gloo).
  double sum(double value);
  std::vector<double> sum(const std::vector<double>& values);
  void barrier();
  /// Host tensors point to point (Gloo, blocking): `t` (contiguous, CPU) to or from world rank `peer`.
  void send_host(const torch::Tensor& t, int peer, int tag);
  void recv_host(torch::Tensor& t, int peer, int tag);
  /// Ends this rank's heartbeat (the end of a run: rank 0, which serves the store, may leave first).
  void stop_heartbeat();
  /// The run directory the heartbeat's messages name for --resume auto.
  void set_run_dir(const std::string& dir);

  /// While one lives, this rank's step loop waits on `what` ("step 12: receiving micro-batch 3's
  /// activation from rank 0"): the heartbeat names it when a peer is lost, and ends the rank with
  /// it when the wait outlasts CommOptions::timeout while every rank still beats (Note [Stalled
  /// ranks]). Null comm: nothing. Not nested: the innermost names the wait.
  class Waiting {
   public:
    Waiting(Comm* comm, std::string what);
    ~Waiting();
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;

   private:
    Comm* comm_;
    std::string outer_;
  };
  /// After a failed collective: the rank whose heartbeat stopped over about two heartbeat periods,
  /// 0 when the store (served by rank 0) no longer answers, -1 when every rank still beats or there
  /// is no heartbeat (Note [Heartbeat]).
  int find_lost_rank();

 private:
  void heartbeat_loop();
  std::pair<std::string, double> current_wait();  // what the step loop waits for, and for how many seconds

  RankInfo info_;
  CommOptions options_;
  c10::intrusive_ptr<c10d::Store> store_, hb_store_;
  c10::intrusive_ptr<c10d::Backend> host_;
  std::vector<c10::intrusive_ptr<c10d::Backend>> device_;  // lanes 0 and 1, the whole world
  std::vector<c10::intrusive_ptr<c10d::Backend>>
      replica_;  // lanes 0 and 1, the stage's replicas (= device_ without a pipeline)
  int stages_ = 1;
  std::vector<c10::intrusive_ptr<c10d::Backend>> links_;  // pipeline stages' point to point: down, up
  std::atomic<bool> stop_{false};
  std::thread heartbeat_;
  std::mutex wait_mu_;  // waiting_, waiting_since_ and run_dir_, between the step loop and the heartbeat
  std::string waiting_, run_dir_;
  std::chrono::steady_clock::time_point waiting_since_;
  std::map<std::string, int> store_calls_;  // check_same's and broadcast_string's calls per key
};

/// Turns c10d's flight recorder off for this process unless the user sized it (Note [Flight
/// recorder]); every maker of a group calls it first.
void keep_flight_recorder_off();

/// A Gloo group of the world `info` describes (host tensors; bound as Note [Process groups] says);
/// UserError when this build has no Gloo.
c10::intrusive_ptr<c10d::Backend> make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, const RankInfo& info,
                                                  std::chrono::milliseconds timeout);

/// The NCCL backend (parallel/nccl_group_cuda.cpp); UserError when this build has no NCCL.
c10::intrusive_ptr<c10d::Backend> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
                                                  int cuda_device, std::chrono::milliseconds timeout);

}  // namespace tandem
