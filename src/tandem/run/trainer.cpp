#include "tandem/run/trainer.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <tuple>

#include "tandem/core/cpu_topology.h"
#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/interrupt.h"
#include "tandem/core/log.h"
#include "tandem/core/stats.h"
#include "tandem/core/strings.h"
#include "tandem/data/dataset.h"
#include "tandem/data/loader.h"
#include "tandem/dist/comm.h"
#include "tandem/dist/grad_reducer.h"
#include "tandem/dist/rank_info.h"
#include "tandem/engine/offload_engine.h"
#include "tandem/engine/param_store.h"
#include "tandem/io/checkpoint.h"
#include "tandem/io/fs.h"
#include "tandem/io/hf.h"
#include "tandem/io/safetensors.h"
#include "tandem/memory/host_fit.h"
#include "tandem/memory/plan.h"
#include "tandem/models/model.h"
#include "tandem/monitor/run_feed.h"
#include "tandem/monitor/sampler.h"
#include "tandem/monitor/tensorboard.h"
#include "tandem/monitor/web_server.h"
#include "tandem/optim/optimizer.h"
#include "tandem/run/autocast.h"
#include "tandem/run/lr_schedule.h"
#include "tandem/run/placement_driver.h"
#include "tandem/run/progress.h"
#include "tandem/run/step_timer.h"
#include "tandem/sched/batch_balance.h"

namespace fs = std::filesystem;

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;



std::string default_run_dir(const std::string& preset) {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&now));
  std::string base = std::string("runs/") + buf + "-" + preset;
  std::string dir = base;
  for (int i = 2; fs::exists(dir); ++i) dir = base + "-" + std::to_string(i);
  return dir;
}

/// Appends one JSON object per line and flushes, so a crash loses at most the current line.
class MetricsWriter {
 public:
  /// An empty path writes nothing (ranks other than 0).
  explicit MetricsWriter(const std::string& path) {
    if (path.empty()) return;
    out_.open(path, std::ios::app);
    TANDEM_CHECK(out_.good(), "cannot open '", path, "' for writing; check the run directory");
  }
  void write(const nlohmann::json& j) {
    if (!out_.is_open()) return;
    out_ << j.dump() << '\n';
    out_.flush();
  }

 private:
  std::ofstream out_;
};

// The Optimizer interface over the offload engine, for checkpoint code: state() and load_state()
// reach the engine's masters' states; the update itself is driven by the step loop.
class EngineOptimizer : public Optimizer {
 public:
  /// `sharded_state`: the state lives in per-rank shard files (Note [Sharded checkpoints]), not here.
  EngineOptimizer(OffloadEngine& e, bool sharded_state) : engine_(e), sharded_state_(sharded_state) {}
  void step(double, const std::optional<torch::Tensor>&) override {
    TANDEM_ASSERT(false, "the offload engine updates through begin_step/end_step");
  }
  void zero_grad() override {}
  std::vector<NamedTensor> state() override { return sharded_state_ ? std::vector<NamedTensor>{} : engine_.state(); }
  void load_state(const std::function<std::optional<torch::Tensor>(const std::string&)>& lookup,
                  const std::string& source) override {
    Optimizer::load_state(lookup, source);
    engine_.sync_step_from_state();
  }

 private:
  OffloadEngine& engine_;
  bool sharded_state_;
};

// Note [Telemetry]
// With monitor.enabled the trainer starts a Sampler (monitor/sampler.h): a thread that reads the
// training GPU through NVML (loaded with dlopen) and the host through /proc and RAPL every
// monitor.period_s. Each metrics.jsonl step row gets the latest reading (gpu_*, cpu_*, host_*
// keys) and the energy the step used, from the cumulative counters read at the step's end (NVML's
// total-energy counter for the GPU, RAPL for the CPU packages): energy_gpu_j, energy_cpu_j and
// their per-token shares. summary.json's "telemetry" holds the run's totals and the sampler's own
// CPU time. A missing source (no driver, RAPL readable by root only) leaves its keys out and is
// said once in the log and in telemetry.missing. Rows also carry t_s (seconds since the loop began)
// and the step's time split (Note [Step time split]). The same rows, and every sample as it is
// taken, go to a RunFeed for the dashboard and /metrics, and optionally to TensorBoard.
// The live endpoints (--dashboard, --metrics-port) read a RunFeed that the step loop and the
// sampler fill; TensorBoard gets each step row's numbers as scalars under <group>/<key>.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& row) {
  std::vector<std::pair<std::string, double>> out;
  for (auto it = row.begin(); it != row.end(); ++it) {
    const std::string& k = it.key();
    if (k == "step" || k == "t_s" || !it->is_number()) continue;
    std::string group = "train";
    for (const char* g : {"gpu", "cpu", "host", "energy", "time", "offload", "mem"})
      if (k.rfind(std::string(g) + "_", 0) == 0) group = g;
    out.emplace_back(group + "/" + k, it->get<double>());
  }
  return out;
}

// Store Blocks (embedding, layers, head) of a plan's decoder-layer count: the GPU prefix includes
// the embedding when layers > 0.
int64_t store_blocks_of(int64_t layers) { return layers > 0 ? layers + 1 : 0; }

// How many Blocks (a prefix: the embedding, then decoder layers) the GPU updates, and the memory
// plan checked against the machine before anything is allocated (Note [ParamStore layout]).
// `range` receives the store-Block prefixes whose plans fit both tiers: the split solver's range.
int64_t plan_gpu_blocks(const ModelSpec& spec, Config& cfg, int64_t seq_len, const torch::Device& device,
                        std::pair<int64_t, int64_t>* range, const RankInfo& ranks) {
  const auto fixed = parse_update_split(cfg.offload.update_split);
  MemoryCapacity cap;
  cap.host_available = cfg.offload.host_memory_gib > 0
                           ? static_cast<int64_t>(cfg.offload.host_memory_gib * double(1 << 30))
                           : host_available_bytes();
  // The ranks on this host share its memory; sharded ranks each hold 1/world of the host rows, which
  // the plan counts whole, so the host they are checked against grows by as much (Note [Sharded store]).
  const int64_t shards = cfg.dist.zero_stage == 2 ? ranks.world_size : 1;
  cap.host_available = cap.host_available * shards / ranks.local_world_size;
  if (device.is_cuda() && accelerator()) cap.gpu_total = accelerator()->memory_stats(device.index()).total;
  int64_t layers = 0;
  if (fixed) {
    layers = std::llround(*fixed * double(spec.n_layer));
  } else if (cap.gpu_total > 0) {
    // auto: the largest prefix the memory plan allows; the measured re-solve refines it later.
    layers = std::max<int64_t>(0, largest_fitting_gpu_blocks(spec, cfg, seq_len, cap));
  }
  const bool ring_auto = cfg.offload.host_ring < 0;
  cfg.offload = resolve_host_ring(spec, cfg, seq_len, layers, cap);
  if (ring_auto && cfg.offload.host_ring > 0)
    log::info(strprintf("offload: per-block host buffers do not fit the host; a ring of %lld slots instead, updates "
                        "after the norm (offload.host_ring=auto, Note [Host ring])",
                        static_cast<long long>(cfg.offload.host_ring)));
  MemoryPlan plan = plan_offload_memory(spec, cfg, seq_len, layers);
  if (cap.gpu_total > 0) {
    std::string why;
    plan = guard_pinned_memory(plan, spec, cfg, seq_len, layers, cap, &why);  // Note [Host memory guard]
    if (!why.empty()) log::warn(why);
  }
  if (cap.gpu_total > 0) {
    try {
      check_plan_fits(plan, cap, cfg.offload, cfg.train);
    } catch (const UserError& e) {
      // Note [Adaptive micro-batch]: a plan that fits at micro-batch 1 may start; the first
      // out-of-memory error halves the micro-batch. One that does not fit even then is refused.
      Config one = cfg;
      one.train.micro_batch = 1;
      if (!cfg.train.oom_retry || cfg.train.micro_batch == 1 ||
          !plan_fits(plan_offload_memory(spec, one, seq_len, layers), cap, cfg.offload))
        throw;
      log::warn(std::string(e.what()) +
                " -- starting anyway: the plan fits at micro-batch 1 and train.oom_retry halves the micro-batch on "
                "out-of-memory");
    }
  }
  check_host_fits(host_demand(plan, !device.is_cuda()), cap.host_available, spec, cfg, !device.is_cuda());
  log::info(strprintf("offload: %lld of %lld decoder blocks updated on the %s (k = %.2f) | plan: device %s, %s host %s",
                      static_cast<long long>(layers), static_cast<long long>(spec.n_layer),
                      device.is_cuda() ? "GPU" : "device", spec.n_layer ? double(layers) / double(spec.n_layer) : 0.0,
                      format_bytes(double(plan.gpu_bytes())).c_str(), plan.pinned ? "pinned" : "pageable",
                      format_bytes(double(plan.pinned ? plan.pinned_bytes() : plan.pageable_bytes())).c_str()));
  // The range the split solver may move within: every layer count whose plan fits both tiers.
  int64_t lo = layers, hi = layers;
  if (cap.gpu_total > 0) {
    const auto fits = [&](int64_t l) { return plan_fits(plan_offload_memory(spec, cfg, seq_len, l), cap, cfg.offload); };
    while (lo > 0 && fits(lo - 1)) --lo;
    while (hi < spec.n_layer && fits(hi + 1)) ++hi;
  } else {
    lo = 0, hi = spec.n_layer;  // the CPU as the device: one memory, no plan tiers to respect
  }
  *range = {store_blocks_of(lo), store_blocks_of(hi)};
  return store_blocks_of(layers);
}

}  // namespace

torch::Device resolve_device(const std::string& s) {
  if (s == "auto") return torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (s == "cpu") return torch::Device(torch::kCPU);
  if (s.rfind("cuda", 0) == 0) {
    TANDEM_CHECK(torch::cuda::is_available(), "train.device=", s,
                 " but no CUDA device is visible (or this build has no CUDA); use train.device=cpu or auto");
    int index = 0;
    if (s.size() > 4) {
      TANDEM_CHECK(s[4] == ':' && s.size() > 5, "train.device '", s, "' is not valid; use cuda or cuda:N");
      try {
        index = std::stoi(s.substr(5));
      } catch (const std::exception&) {
        TANDEM_FAIL("train.device '", s, "' is not valid; use cuda or cuda:N");
      }
    }
    const int n = static_cast<int>(torch::cuda::device_count());
    TANDEM_CHECK(index >= 0 && index < n, "train.device=", s, " but only ", n, " CUDA device(s) are visible");
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  TANDEM_FAIL("train.device must be auto, cpu, cuda or cuda:N; got '", s, "'");
}

// Note [Data parallel]
// Under a launcher (dist/rank_info.h) every rank trains the same model on its own rows of each
// global micro-batch: rank r takes rows [first_r, first_r + rows_r) of the batch one process with
// train.micro_batch x world rows would draw (the sampler is counter-based per row), weights its
// loss by rows_r / global rows, and the gradients are summed (the engine's per-Block reduction,
// or GradReducer). Steps therefore equal one process's with the same global batch, up to the
// summation order. The ranks check that they run one config (its hash) before the first step and
// take rank 0's run directory, memory plan and update split, so their collectives match. Rank 0
// alone writes the run directory's files; checkpoints are whole (replicated state, rank 0 writes)
// or sharded (Note [Sharded checkpoints]). With dist.balance the rows per rank may differ (unequal
// GPUs, seed 002): given, or measured after dist.balance_after steps from each rank's compute time
// per row and device memory headroom (balance_rows), the global batch unchanged. The ranks of one
// host divide its cores (the CPU affinity mask they share) into disjoint ranges, and the CPU update
// kernels use their rank's range, so the local ranks' CPU updates never oversubscribe the host.

namespace {

TrainSummary train_on(Config& cfg, const TrainOptions& options, const RankInfo& ranks, torch::Device device,
                      std::unique_ptr<Comm>& comm);

// Note [Peer loss]
// A rank that dies (killed, crashed, out of memory) breaks the collectives of the others mid-call
// with a transport error ("Connection reset by peer"). A survivor that catches any such failure
// asks the heartbeat which rank went silent (Comm::find_lost_rank) and reports that rank and how
// the run continues: the launcher's restart from the newest checkpoint while restarts remain,
// else --resume auto by hand. It exits with kExitPeerLost; the original error is kept when no
// rank is found lost.
void throw_if_peer_lost(Comm& comm, const std::string& what, const std::string& run_dir) {
  const int lost = comm.find_lost_rank();
  if (lost < 0) return;
  const RankInfo& ranks = comm.info();
  throw PeerLostError(strprintf("rank %d stopped (rank %d saw: %s); %s", lost, ranks.rank,
                                one_line(what).substr(0, 160).c_str(),
                                how_the_run_continues(ranks, run_dir).c_str()));
}

}  // namespace

TrainSummary train(Config cfg, const TrainOptions& options) {
  validate_config(cfg);
  const RankInfo ranks = discover_rank();
  torch::Device device = resolve_device(cfg.train.device);
  // A launcher's device slot counts even for one process (a run gone on with fewer workers).
  if ((ranks.distributed() || ranks.device_index >= 0) && device.is_cuda()) {
    const int n = static_cast<int>(torch::cuda::device_count());
    TANDEM_CHECK(ranks.gpu() < n, "rank ", ranks.rank, " would train on GPU ", ranks.gpu(), " but only ", n,
                 " are visible; start at most ", n, " processes per node");
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(ranks.gpu()));
  }
  const int device_index = device.is_cuda() ? device.index() : -1;
  std::unique_ptr<Comm> comm;
  int cpu_share = 0;  // this rank's cores, when the host's are divided (Note [Data parallel])
  std::string cpu_how;
  if (ranks.local_world_size > 1) {
    // The local ranks split the cores they all may use into disjoint shares (Note [Core division])
    // before any thread starts (every later thread inherits the mask): the CPU updates of two
    // ranks never share a core.
    const std::vector<int> cpus = rank_cpus(ranks.local_rank, ranks.local_world_size, &cpu_how);
    if (!cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      for (const int c : cpus) CPU_SET(c, &set);
      if (sched_setaffinity(0, sizeof set, &set) == 0) cpu_share = static_cast<int>(cpus.size());
    }
  }
  if (ranks.distributed()) {
    CommOptions co;
    co.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.dist.timeout_s * 1e3));
    co.nccl = device.is_cuda() && cfg.dist.backend != "gloo";
    TANDEM_CHECK(!(cfg.dist.backend == "nccl" && !device.is_cuda()), "dist.backend=nccl needs GPUs; this run is on ",
                 device.str(), ": set dist.backend=auto or gloo");
    co.cuda_device = device_index;
    co.heartbeat_s = cfg.dist.heartbeat_s;
    co.heartbeat_timeout_s = cfg.dist.heartbeat_timeout_s;
    comm = std::make_unique<Comm>(ranks, co);
    comm->check_same("configurations", config_hash(cfg),
                     "start every rank with the same config files, --set options and preset");
    log::info(strprintf("rank %d of %d (%s; local %d of %d) on %s | %s | rendezvous %s:%d%s", ranks.rank,
                        ranks.world_size, ranks.source.c_str(), ranks.local_rank, ranks.local_world_size,
                        device.str().c_str(), co.nccl ? "NCCL" : "Gloo", ranks.master_addr.c_str(), ranks.master_port,
                        ranks.restart_count ? strprintf(" | restart %d", ranks.restart_count).c_str() : ""));
    if (ranks.rank != 0) cfg.train.progress = "off";
    if (cpu_share > 0) log::info(strprintf("rank %d: CPU share %s", ranks.rank, cpu_how.c_str()));
    // torchrun sets OMP_NUM_THREADS=1: the CPU update kernels take this rank's cores instead,
    // unless optim.cpu_threads or TANDEM_CPU_THREADS says otherwise.
    if (cpu_share > 0 && cfg.optim.cpu_threads == 0 && std::getenv("TANDEM_CPU_THREADS") == nullptr)
      cfg.optim.cpu_threads = cpu_share;
  }
  try {
    return train_on(cfg, options, ranks, device, comm);
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    if (comm) throw_if_peer_lost(*comm, e.what(), cfg.train.run_dir);
    throw;
  }
}

namespace {

// The run after device, rank and rendezvous setup (train()).
TrainSummary train_on(Config& cfg, const TrainOptions& options, const RankInfo& ranks, torch::Device device,
                      std::unique_ptr<Comm>& comm) {
  const int device_index = device.is_cuda() ? device.index() : -1;
  const bool main_rank = ranks.rank == 0;
  const int world = ranks.world_size;
  TANDEM_CHECK(cfg.dist.zero_stage == 0 || cfg.offload.optimizer == OffloadTarget::kCpu,
               "dist.zero_stage=2 shards the offload engine's masters and optimizer states; set offload.optimizer=cpu, "
               "or dist.zero_stage=0");
  if (device.is_cuda()) {
    at::globalContext().setFloat32MatmulPrecision(cfg.train.tf32 ? "high" : "highest");
    at::globalContext().setAllowTF32CuDNN(cfg.train.tf32);
    at::globalContext().setBenchmarkCuDNN(cfg.train.cudnn_benchmark && !cfg.train.deterministic);
  }
  // Process-wide switches: restored when train() returns, so later runs in the process get theirs.
  struct DeterminismGuard {
    at::Context& c = at::globalContext();
    bool det = c.deterministicAlgorithms(), warn = c.deterministicAlgorithmsWarnOnly();
    bool flash = c.userEnabledFlashSDP(), mem = c.userEnabledMemEfficientSDP(), cudnn = c.userEnabledCuDNNSDP(),
         math = c.userEnabledMathSDP();
    ~DeterminismGuard() {
      c.setDeterministicAlgorithms(det, warn);
      c.setSDPUseFlash(flash);
      c.setSDPUseMemEfficient(mem);
      c.setSDPUseCuDNN(cudnn);
      c.setSDPUseMath(math);
    }
  } determinism_guard;
  if (cfg.train.deterministic) {
    // cuBLAS needs a fixed workspace layout for reproducible reductions; read at its first handle.
    ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
    // The fused attention kernels accumulate dQ with atomics in their backward, which the flag
    // does not change (only warns, once): the reference path is two matmuls and a softmax, whose
    // B x H x T x T scores the memory estimate does not count (deterministic runs are for checks).
    if (device.is_cuda()) {
      at::globalContext().setSDPUseFlash(false);
      at::globalContext().setSDPUseMemEfficient(false);
      at::globalContext().setSDPUseCuDNN(false);
      at::globalContext().setSDPUseMath(true);
    }
  }
  const bool offload = cfg.offload.optimizer == OffloadTarget::kCpu;
  if (offload) {
    TANDEM_CHECK(cfg.optim.type == "adamw" || cfg.optim.type == "adam",
                 "offload.optimizer=cpu runs optim.type=adamw or adam; got '", cfg.optim.type,
                 "'; use offload.optimizer=none for sgd and lion");
  }

  // Checkpoint to resume from, before anything is created.
  std::string resume_dir;
  if (!options.resume.empty()) resume_dir = resolve_checkpoint_dir(options.resume);

  // Architecture: the preset with overrides, or an HF directory's config.json.
  ModelSpec spec;
  if (!cfg.model.init_from.empty()) {
    const std::string src = resume_dir.empty() ? cfg.model.init_from : resume_dir;
    spec = spec_from_hf_config((fs::path(src) / "config.json").string());
    spec.name = "hf";
  } else {
    spec = resolve_model_spec(cfg.model);
  }
  const int64_t seq_len = cfg.train.seq_len > 0 ? cfg.train.seq_len : std::min<int64_t>(spec.max_seq_len, 2048);
  TANDEM_CHECK(seq_len <= spec.max_seq_len, "train.seq_len=", seq_len, " exceeds model.max_seq_len=", spec.max_seq_len,
               "; lower train.seq_len or raise model.max_seq_len");

  // Note [Host fit]: refused before anything is read or allocated when the host cannot hold the run
  // (the offload engine's plan is checked in plan_gpu_blocks).
  if (!offload) {
    const int64_t available = cfg.offload.host_memory_gib > 0
                                  ? static_cast<int64_t>(cfg.offload.host_memory_gib * double(1 << 30))
                                  : host_available_bytes();
    check_host_fits(host_demand(spec, cfg, seq_len, !device.is_cuda()), available / ranks.local_world_size, spec, cfg,
                    !device.is_cuda());
    if (device.is_cuda() && accelerator()) check_gpu_floor(spec, accelerator()->memory_stats(device.index()).total);
  }

  DataSplits data = open_data(cfg.data);

  // Run directory: explicit, the resumed run's, or a new one under runs/.
  std::string run_dir = cfg.train.run_dir;
  if (run_dir.empty() && !resume_dir.empty()) run_dir = fs::path(resume_dir).parent_path().parent_path().string();
  if (run_dir.empty()) run_dir = default_run_dir(spec.name);
  if (comm) run_dir = comm->broadcast_string("run_dir", run_dir);  // one directory, named by rank 0
  ensure_writable_directory(run_dir, "run directory");
  const std::string ckpt_parent = (fs::path(run_dir) / "checkpoints").string();

  // The offload memory plan, checked against the machine before anything is allocated (the
  // model's own fp32 build would otherwise count against the host memory it is about to free).
  std::pair<int64_t, int64_t> range;
  int64_t gpu_blocks = 0;
  if (offload) {
    gpu_blocks = plan_gpu_blocks(spec, cfg, seq_len, device, &range, ranks);  // resolves offload.host_ring
    if (cfg.offload.host_ring == -1) cfg.offload.host_ring = 0;       // no plan to choose from (the CPU as the device)
    if (cfg.offload.host_ring > 0) cfg.offload.speculate = "never";
    if (comm) {  // rank 0's plan everywhere: the ranks' collectives must match Block for Block
      const auto plan0 = comm->from_rank0({double(gpu_blocks), double(cfg.offload.host_ring), double(range.first),
                                           double(range.second)});
      gpu_blocks = static_cast<int64_t>(plan0[0]);
      cfg.offload.host_ring = static_cast<int64_t>(plan0[1]);
      if (cfg.offload.host_ring > 0) cfg.offload.speculate = "never";
      range = {static_cast<int64_t>(plan0[2]), static_cast<int64_t>(plan0[3])};
    }
  }

  // Model, weights and optimizer.
  const auto t_build = std::chrono::steady_clock::now();
  torch::manual_seed(cfg.train.seed);
  auto model = build_model(spec, cfg.model.checkpointing);
  const double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_build).count();
  if (!cfg.model.init_from.empty() && resume_dir.empty()) {
    load_hf_weights(*model, cfg.model.init_from);
    log::info("initialised from " + cfg.model.init_from);
  }
  model->train();
  std::unique_ptr<ParamStore> store;
  RunFeed feed;                      // read by the live endpoints; outlives the sampler feeding it
  std::unique_ptr<Sampler> sampler;  // started with the loop (Note [Telemetry])
  std::unique_ptr<OffloadEngine> engine;
  std::unique_ptr<PlacementDriver> placement;  // Note [Block placement]
  std::unique_ptr<Optimizer> optimizer_ptr;
  if (offload) {
    // Parameters stay on the host as the fp32 masters; only buffers (RoPE tables) move.
    for (auto& b : model->buffers()) b.set_data(b.to(device));
    ParamStoreOptions so;
    so.device = device;
    so.compute_dtype = cfg.train.precision == Precision::kBf16   ? torch::kBFloat16
                       : cfg.train.precision == Precision::kFp16 ? torch::kHalf
                                                                 : torch::kFloat32;
    so.pin_memory = cfg.offload.pin_memory;
    so.host_state_dtype = cfg.optim.state_dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
    so.ring_slots = cfg.offload.host_ring;
    so.undo = cfg.offload.speculate != "never" && !cfg.offload.delayed_update;
    if (comm && cfg.dist.zero_stage == 2) {
      so.shard_rank = ranks.rank;
      so.shard_count = world;
      so.comm = comm.get();
    }
    const auto t_store = std::chrono::steady_clock::now();
    store = std::make_unique<ParamStore>(*model, so, gpu_blocks);
    // Note [Block placement]: Blocks that may run on the CPU stay CPU-updated whatever the split.
    const std::vector<bool> movable = placement_movable(cfg.placement, *model);
    const auto n_movable = std::count(movable.begin(), movable.end(), true);
    if (n_movable > 0) {
      TANDEM_CHECK(!comm, "placement.policy=", cfg.placement.policy,
                   " runs in one process; run one process or set placement.policy=off");
      TANDEM_CHECK(so.ring_slots == 0, "placement.policy=", cfg.placement.policy,
                   " needs per-block host buffers, but the memory plan chose a host ring of ", so.ring_slots,
                   " slots (host memory is short): set offload.host_ring=0 if the host holds them, or "
                   "placement.policy=off");
      store->keep_cpu_updated(movable);
      range.second = std::min<int64_t>(range.second, static_cast<int64_t>(movable.size()) - n_movable);
      range.first = std::min(range.first, range.second);
    }
    log::info(strprintf("offload: model built in %.1f s, parameter store (%s host buffers) in %.1f s", build_s,
                        so.pin_memory && device.is_cuda() ? "pinned" : "plain",
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_store).count()));
    EngineOptions eo;
    eo.adam.beta1 = cfg.optim.beta1;
    eo.adam.beta2 = cfg.optim.beta2;
    eo.adam.eps = cfg.optim.eps;
    eo.adam.weight_decay = cfg.optim.weight_decay;
    eo.adam.decoupled = cfg.optim.type == "adamw";
    eo.grad_clip = cfg.train.grad_clip;
    eo.speculate = cfg.offload.speculate == "always"  ? EngineOptions::Speculate::kAlways
                   : cfg.offload.speculate == "never" ? EngineOptions::Speculate::kNever
                                                      : EngineOptions::Speculate::kAuto;
    eo.delayed = cfg.offload.delayed_update;
    eo.mirror_every = cfg.placement.mirror_every;
    eo.state_rounding = cfg.optim.state_rounding == "stochastic" ? Rounding::kStochastic : Rounding::kNearestEven;
    eo.solve_split = true;
    eo.fixed_k = parse_update_split(cfg.offload.update_split);
    eo.min_gpu_blocks = range.first;
    eo.max_gpu_blocks = range.second;
    eo.resolve_every = cfg.offload.resolve_every;
    eo.trace_steps =
        main_rank ? parse_step_list(cfg.offload.trace_steps, "offload.trace_steps") : std::vector<int64_t>{};
    eo.comm = comm.get();
    eo.trace_path = (fs::path(run_dir) / "trace.json").string();
    eo.log = [](const std::string& line) { log::info(line); };
    eo.trace_counters = [&sampler](std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
      std::vector<EngineOptions::CounterPoint> out;
      if (!sampler) return out;
      sampler->sample_now();  // a reading at the traced steps' end
      const auto at = [&](double t) {
        return std::chrono::steady_clock::time_point(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(sampler->start_s() + t)));
      };
      for (const auto& smp : sampler->since(0)) {
        const auto tp = at(smp.t);
        if (tp < from || tp > to) continue;
        const nlohmann::json j = telemetry_json(smp);
        for (const auto& [key, track, scale] :
             {std::tuple<const char*, const char*, double>{"gpu_power_w", "GPU power (W)", 1.0},
              {"gpu_util_pct", "GPU utilisation (%)", 1.0},
              {"gpu_mem_used_bytes", "GPU memory used (GiB)", 1.0 / double(1 << 30)},
              {"cpu_util_pct", "CPU utilisation (%)", 1.0},
              {"host_mem_used_bytes", "host memory used (GiB)", 1.0 / double(1 << 30)}})
          if (j.contains(key)) out.push_back({tp, track, j[key].get<double>() * scale});
      }
      return out;
    };
    engine = std::make_unique<OffloadEngine>(*model, *store, eo);
    optimizer_ptr = std::make_unique<EngineOptimizer>(*engine, cfg.dist.zero_stage == 2);
    if (cfg.placement.policy != "off")
      placement = std::make_unique<PlacementDriver>(cfg.placement, *model, *engine,
                                                    [](const std::string& line) { log::info(line); });
  } else {
    model->to(device);
    optimizer_ptr = make_optimizer(cfg.optim, model->hf_parameters(), device);
  }
  std::unique_ptr<GradReducer> reducer;  // Note [Gradient reducer]
  if (comm && !engine) reducer = std::make_unique<GradReducer>(*model, *comm);
  Optimizer& optimizer = *optimizer_ptr;
  // Checkpoint code reads and writes the fp32 masters when the engine holds them.
  const auto with_weights = [&](const std::function<void()>& fn) {
    if (!engine) return fn();
    engine->wait_all();
    store->with_masters_bound(fn);
  };

  TrainerState state;
  state.loss_scale = cfg.scaler.init_scale;
  state.config_hash = config_hash(cfg);
  // Note [Sharded checkpoints]: dist.zero_stage=2 runs save per-rank shards at every world size.
  const bool zero_format = engine && cfg.dist.zero_stage == 2;
  if (!resume_dir.empty() && checkpoint_zero_world(resume_dir) > 0) {
    TANDEM_CHECK(zero_format, "checkpoint ", resume_dir,
                 " holds optimizer shards (dist.zero_stage=2); resume it with "
                 "offload.optimizer=cpu and dist.zero_stage=2, at any world size (1 included)");
    state = load_checkpoint_state(resume_dir, device_index);
    const ZeroShards shards(resume_dir);
    store->load_shard_state([&](const std::string& block, const std::string& kind, int64_t offset, int64_t n,
                                torch::Tensor out) { shards.read(block, kind, offset, n, out); });
    SafetensorsFile first((fs::path(resume_dir) / zero_shard_file(0)).string());
    engine->set_step_count(static_cast<int64_t>(first.tensor("_step").item<double>()));
    log::info(strprintf("resumed from %s at step %lld (optimizer shards of %d ranks, now %d)", resume_dir.c_str(),
                        static_cast<long long>(state.step), shards.world(), world));
  } else if (!resume_dir.empty()) {
    TANDEM_CHECK(!zero_format || world == 1, "checkpoint ", resume_dir,
                 " holds whole optimizer state; resume it with "
                 "dist.zero_stage=0, or in one process, and save again to shard it");
    with_weights([&] { state = load_checkpoint(resume_dir, *model, optimizer, device_index); });
    log::info(strprintf("resumed from %s at step %lld", resume_dir.c_str(), static_cast<long long>(state.step)));
  }

  // Written only once the model, weights and checkpoint are known to be good, so a failed
  // resume leaves the run directory's files as they were.
  if (main_rank) {
    write_file_atomic((fs::path(run_dir) / "config.yaml").string(), config_to_yaml(cfg));
    write_file_atomic((fs::path(run_dir) / "model_config.json").string(), hf_config_json(spec));
  }

  const auto fopts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  const bool fp16 = cfg.train.precision == Precision::kFp16;
  torch::Tensor scale = torch::full({1}, state.loss_scale, fopts);
  torch::Tensor growth_tracker =
      torch::full({1}, state.growth_tracker, torch::TensorOptions().dtype(torch::kInt32).device(device));

  // Note [Data parallel]: this rank's rows of each global micro-batch.
  const int64_t global_rows = cfg.train.micro_batch * world;
  std::vector<int64_t> rank_rows(static_cast<size_t>(world), cfg.train.micro_batch);
  if (cfg.dist.balance != "equal" && cfg.dist.balance != "auto") {
    const auto parts = split(cfg.dist.balance, ',');
    TANDEM_CHECK(static_cast<int>(parts.size()) == world, "dist.balance='", cfg.dist.balance, "' gives ", parts.size(),
                 " row counts for ", world, " ranks; give one per rank, or equal / auto");
    int64_t sum = 0;
    for (size_t r = 0; r < parts.size(); ++r) {
      rank_rows[r] = std::atoll(parts[r].c_str());
      TANDEM_CHECK(rank_rows[r] >= 1, "dist.balance: '", parts[r], "' is not a row count >= 1");
      sum += rank_rows[r];
    }
    TANDEM_CHECK(sum == global_rows, "dist.balance='", cfg.dist.balance, "' sums to ", sum,
                 " rows; the global micro-batch is train.micro_batch x world = ", global_rows);
  }
  const auto first_row_of = [&](int r) {
    int64_t f = 0;
    for (int q = 0; q < r; ++q) f += rank_rows[static_cast<size_t>(q)];
    return f;
  };
  double rank_share = double(rank_rows[static_cast<size_t>(ranks.rank)]) / double(global_rows);
  std::unique_ptr<BatchLoader> train_loader =
      std::make_unique<BatchLoader>(data.train, rank_rows[static_cast<size_t>(ranks.rank)], seq_len, cfg.train.seed,
                                    device, cfg.data.prefetch, spec.vocab_size, "training", first_row_of(ranks.rank));
  // Note [Adaptive micro-batch] retries a step on one rank only; the others' collectives would not match.
  if (comm && cfg.train.oom_retry) {
    cfg.train.oom_retry = false;
    log::info("train.oom_retry is off with several ranks (a retried step on one rank would not match the others)");
  }
  train_loader->seek(state.data_position);
  std::unique_ptr<BatchLoader> val_loader;
  if (cfg.train.eval_every > 0 && main_rank && data.val.size() >= seq_len + 1)  // rank 0 evaluates
    val_loader = std::make_unique<BatchLoader>(data.val, cfg.train.micro_batch, seq_len, cfg.train.seed ^ 0x5eedull,
                                               device, cfg.data.prefetch, spec.vocab_size, "held-out");
  else if (cfg.train.eval_every > 0 && main_rank)
    log::warn(strprintf("no held-out data (data.val_fraction=%g leaves %lld tokens); evaluation is off",
                        cfg.data.val_fraction, static_cast<long long>(data.val.size())));

  const int64_t tokens_per_step = global_rows * seq_len * cfg.train.grad_accum;  // every rank's
  log::info(strprintf("model %s (%s params, %lld layers, d_model %lld) on %s | %s | data: %s", spec.name.c_str(),
                      format_count(double(spec.num_params_unpadded())).c_str(), static_cast<long long>(spec.n_layer),
                      static_cast<long long>(spec.d_model), device.str().c_str(), to_string(cfg.train.precision),
                      data.description.c_str()));
  log::info(strprintf(
      "batch %lld x %lld tokens x %lld accumulation = %lld tokens/step%s | run dir %s",
      static_cast<long long>(global_rows), static_cast<long long>(seq_len),
      static_cast<long long>(cfg.train.grad_accum), static_cast<long long>(tokens_per_step),
      comm
          ? strprintf(" | rows %lld .. %lld on rank %d of %d", static_cast<long long>(first_row_of(ranks.rank)),
                      static_cast<long long>(first_row_of(ranks.rank) + rank_rows[static_cast<size_t>(ranks.rank)] - 1),
                      ranks.rank, world)
                .c_str()
          : "",
      run_dir.c_str()));

  MetricsWriter metrics(main_rank ? (fs::path(run_dir) / "metrics.jsonl").string() : std::string());
  feed.set_info({{"run_dir", run_dir},
                 {"model", strprintf("%s (%s params)", spec.name.c_str(), format_count(double(spec.num_params_unpadded())).c_str())},
                 {"device", device.str()},
                 {"precision", to_string(cfg.train.precision)},
                 {"mode", engine ? "offload engine" : "GPU-resident"}});
  std::vector<std::unique_ptr<WebServer>> servers;
  const auto serve = [&](int64_t port, bool dashboard, bool metrics_endpoint) {
    WebServerOptions wo;
    wo.host = cfg.monitor.bind;
    wo.port = static_cast<int>(port);
    wo.dashboard = dashboard;
    wo.metrics = metrics_endpoint;
    wo.chartjs_path = cfg.monitor.chartjs;
    wo.run_label = fs::absolute(run_dir).lexically_normal().filename().string();
    servers.push_back(std::make_unique<WebServer>(feed, wo));
    if (!servers.back()->warning().empty()) log::warn(servers.back()->warning());
    log::info(std::string(dashboard ? "dashboard" : "Prometheus metrics") + " at " + servers.back()->url() +
              (dashboard ? "" : "metrics") + (dashboard && metrics_endpoint ? " (and /metrics)" : ""));
  };
  if (cfg.monitor.dashboard_port > 0 && main_rank)
    serve(cfg.monitor.dashboard_port, true, cfg.monitor.metrics_port == cfg.monitor.dashboard_port);
  if (cfg.monitor.metrics_port > 0 && cfg.monitor.metrics_port != cfg.monitor.dashboard_port && main_rank)
    serve(cfg.monitor.metrics_port, false, true);
  std::unique_ptr<TensorBoardWriter> tensorboard;
  if (cfg.monitor.tensorboard && main_rank) {
    tensorboard = std::make_unique<TensorBoardWriter>((fs::path(run_dir) / "tensorboard").string());
    log::info("TensorBoard scalars: " + tensorboard->path());
  }
  const auto wall_now = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  };
  // Every metrics row goes to the file, the live feed and TensorBoard.
  const auto publish = [&](const nlohmann::json& row) {
    metrics.write(row);
    feed.add_row(row);
    if (tensorboard) tensorboard->scalars(row.value("step", int64_t{0}), tensorboard_scalars(row), wall_now());
  };
  StepTimer timer(device);
  Progress progress(cfg.train.progress, cfg.train.log_every);
  TrainSummary summary;
  summary.run_dir = run_dir;
  summary.first_step = state.step;
  std::vector<double> step_times;
  if (device_index >= 0 && accelerator()) accelerator()->reset_peak_memory(device_index);

  std::vector<torch::Tensor> params;
  for (auto& [name, p] : model->hf_parameters()) params.push_back(p);

  const auto evaluate = [&]() -> double {
    torch::NoGradGuard no_grad;
    model->eval();
    val_loader->seek(0);
    torch::Tensor sum = torch::zeros({}, fopts);
    for (int64_t i = 0; i < cfg.train.eval_batches; ++i) {
      Batch b = val_loader->next();
      AutocastGuard ac(device.type(), cfg.train.precision);
      sum += model->loss(model->forward(b.inputs), b.targets).detach();
    }
    model->train();
    return sum.item<double>() / double(cfg.train.eval_batches);
  };
  // Note [Asynchronous checkpoints]
  // With train.async_checkpoint a checkpoint blocks training only while its snapshot is taken (the
  // engine's masters and states, or the device weights, cloned into host memory between steps);
  // a background thread writes it (Note [Checkpoint layout]) while the next steps run. One write
  // is in flight at a time: the next checkpoint, a stop and the end of the run wait for it. When
  // the snapshot would not leave 2 GiB of host memory free, the checkpoint is written in place,
  // synchronously, and the log says why. Its result is collected on the step loop's thread.
  struct PendingWrite {
    std::future<std::string> result;
    int64_t step;
    Clock::time_point started;
  };
  std::optional<PendingWrite> pending;
  const auto checkpoint_failed = [&](int64_t step, const std::string& why) {
    summary.checkpoint_error = strprintf("step %lld: %s", static_cast<long long>(step), why.c_str());
    log::warn(strprintf("checkpoint at step %lld failed: %s; the earlier checkpoints are kept and training goes on",
                        static_cast<long long>(step), why.c_str()));
    publish({{"step", step}, {"checkpoint_failed", why}});
  };
  const auto collect_checkpoint = [&](bool wait) {
    if (!pending || (!wait && pending->result.wait_for(std::chrono::seconds(0)) != std::future_status::ready)) return;
    PendingWrite done = std::move(*pending);
    pending.reset();
    try {
      summary.last_checkpoint = done.result.get();
    } catch (const InternalError&) {
      throw;
    } catch (const std::exception& e) {
      return checkpoint_failed(done.step, e.what());
    }
    const double write_s = std::chrono::duration<double>(Clock::now() - done.started).count();
    prune_checkpoints(ckpt_parent, cfg.train.keep_checkpoints);
    publish({{"step", done.step}, {"checkpoint", summary.last_checkpoint}, {"checkpoint_write_s", write_s}});
    progress.message(strprintf("checkpoint %s written in the background (%.2f s)", summary.last_checkpoint.c_str(), write_s));
  };
  bool said_sync = false;
  // Note [Sharded checkpoints]: every rank writes its shard, rank 0 the rest and the manifest.
  const auto zero_checkpoint = [&] {
    const auto t0 = Clock::now();
    engine->wait_all();
    const std::string staging = zero_staging_dir(ckpt_parent, state.step);
    std::string error;
    try {
      if (main_rank) ensure_writable_directory(ckpt_parent, "checkpoint directory");
      if (comm) comm->barrier();
      fs::create_directories(staging);
      nlohmann::json blocks = nlohmann::json::object();
      for (const auto& b : store->blocks()) blocks[b.name] = {b.numel, b.shard_offset, b.shard_numel};
      auto tensors = store->shard_state();
      tensors.emplace_back("_step", torch::full({}, double(engine->stats().steps), torch::kFloat64));
      const nlohmann::json meta = {{"rank", ranks.rank}, {"world", world}, {"blocks", blocks}};
      write_safetensors((fs::path(staging) / zero_shard_file(ranks.rank)).string(), tensors,
                        {{"tandem_zero", meta.dump()}});
    } catch (const InternalError&) {
      throw;
    } catch (const std::exception& e) {
      error = strprintf("rank %d: %s", ranks.rank, e.what());
    }
    const double failed = comm ? comm->sum(error.empty() ? 0.0 : 1.0) : (error.empty() ? 0.0 : 1.0);
    std::string path;
    if (main_rank) {
      try {
        TANDEM_CHECK(failed == 0,
                     error.empty() ? strprintf("%.0f rank(s) could not write their shards", failed) : error);
        CheckpointSnapshot snap = take_checkpoint_snapshot(*model, optimizer, state, cfg, device_index, true);
        snap.zero_world = world;
        for (int r = 0; r < world; ++r) snap.adopt.push_back((fs::path(staging) / zero_shard_file(r)).string());
        path = write_checkpoint(ckpt_parent, snap);
      } catch (const InternalError&) {
        throw;
      } catch (const std::exception& e) {
        error = e.what();
      }
      std::error_code ec;
      fs::remove_all(staging, ec);
    }
    if (comm) comm->barrier();  // no rank goes on (or ends) before the checkpoint is whole
    if (!main_rank) return;
    if (!error.empty()) return checkpoint_failed(state.step, error);
    summary.last_checkpoint = path;
    prune_checkpoints(ckpt_parent, cfg.train.keep_checkpoints);
    const double blocking_s = std::chrono::duration<double>(Clock::now() - t0).count();
    publish({{"step", state.step}, {"checkpoint", path}, {"checkpoint_blocking_s", blocking_s}});
    progress.message(strprintf("checkpoint %s, %d shard(s) (%.2f s)", path.c_str(), world, blocking_s));
  };
  const auto checkpoint = [&](bool allow_async) {
    collect_checkpoint(true);  // one write at a time
    state.data_position = train_loader->position();
    state.loss_scale = scale.item<double>();
    state.growth_tracker = growth_tracker.item<int64_t>();
    if (zero_format) return zero_checkpoint();
    if (!main_rank) return;  // replicated state: rank 0 writes it
    const auto t0 = Clock::now();
    const bool want_background = allow_async && cfg.train.async_checkpoint;
    // Note [Checkpoint failures]
    // A checkpoint that cannot be written (full disk, directory made read-only, quota) fails alone:
    // its temporary directory is removed, the earlier checkpoints stay (pruning runs only after a
    // success), the run goes on and says so in the log and in metrics.jsonl.
    try {
      // The snapshot refers to the live tensors; for a background write it is copied to the host,
      // unless the copy would leave less than 2 GiB free: then it is written in place from them.
      CheckpointSnapshot snap;
      bool background = false;
      with_weights([&] {
        snap = take_checkpoint_snapshot(*model, optimizer, state, cfg, device_index, false);
        if (want_background) {
          const int64_t need = checkpoint_snapshot_bytes(snap), avail = host_available_bytes();
          background = need + (int64_t{2} << 30) <= avail;
          if (background) {
            own_checkpoint_snapshot(snap);
          } else if (!said_sync) {
            said_sync = true;
            log::info(strprintf("checkpoints are written synchronously: a snapshot needs %s of host memory, %s is "
                                "available",
                                format_bytes(double(need)).c_str(), format_bytes(double(avail)).c_str()));
          }
        }
        if (!background) summary.last_checkpoint = write_checkpoint(ckpt_parent, snap);
      });
      if (background) {
        const double blocking_s = std::chrono::duration<double>(Clock::now() - t0).count();
        pending = PendingWrite{std::async(std::launch::async,
                                          [parent = ckpt_parent, snap = std::move(snap)] { return write_checkpoint(parent, snap); }),
                               state.step, Clock::now()};
        publish({{"step", state.step}, {"checkpoint_blocking_s", blocking_s}});
        return;
      }
    } catch (const InternalError&) {
      throw;
    } catch (const std::exception& e) {
      return checkpoint_failed(state.step, e.what());
    }
    prune_checkpoints(ckpt_parent, cfg.train.keep_checkpoints);
    const double blocking_s = std::chrono::duration<double>(Clock::now() - t0).count();
    publish({{"step", state.step}, {"checkpoint", summary.last_checkpoint}, {"checkpoint_blocking_s", blocking_s}});
    progress.message(strprintf("checkpoint %s (%.2f s)", summary.last_checkpoint.c_str(), blocking_s));
  };

  const auto run_start = Clock::now();
  // Telemetry (Note [Telemetry]): GPU and host readings beside each step, energy per step.
  if (cfg.monitor.enabled) {
    SamplerOptions so;
    so.period_s = cfg.monitor.period_s;
    if (device_index >= 0) so.cuda_devices = {device_index};
    so.on_sample = [&feed, run_start](const TelemetrySample& smp) {
      nlohmann::json j = telemetry_json(smp);
      j["t_s"] = std::chrono::duration<double>(Clock::now() - run_start).count();
      feed.add_sample(std::move(j));
    };
    sampler = std::make_unique<Sampler>(so);
    for (const auto& why : sampler->why_missing()) log::info("telemetry: " + why);
  }
  EnergyCounters energy0 = sampler ? sampler->energy_now() : EnergyCounters{};
  EnergyCounters energy_prev = energy0;
  const double sampler_cpu0 = sampler ? sampler->thread_cpu_s() : 0.0;
  const auto loop_start = Clock::now();
  int64_t tokens_run = 0;

  int64_t oom_parts = 1, oom_clean_steps = 0;  // Note [Adaptive micro-batch]
  std::vector<double> compute_s;               // forward + backward seconds per step (dist.balance=auto)
  for (int64_t step = state.step; step < cfg.train.steps; ++step) {
    const auto t0 = Clock::now();
    const double lr = lr_at(cfg.optim, step, cfg.train.steps);
    const EngineStats stats0 = engine ? engine->stats() : EngineStats{};  // one locked copy
    // Note [Adaptive micro-batch]
    // An out-of-memory error in a forward or backward gives the step up (the engine undoes what it
    // began), frees the cache, rewinds the loader to the step's first micro-batch and runs the step
    // again with each micro-batch cut into twice as many parts: the micro-batch halves, the
    // accumulation doubles, and the step sees the same samples with the same weights (each part's
    // loss weighted by its share of rows), so only the summation order differs. After
    // train.oom_grow_after clean steps the parts halve again. At micro-batch 1 the plan cannot fit.
    torch::Tensor loss_sum;
    const int64_t data_pos0 = train_loader->position();
    if (placement) {
      const TelemetrySample latest = sampler ? sampler->latest() : TelemetrySample{};
      placement->before_step(step + 1, sampler ? &latest : nullptr);
    }
    for (;;) {
      timer.begin();
      loss_sum = torch::zeros({}, fopts);
      if (engine) engine->begin_step(lr, fp16 ? scale.item<double>() : 1.0);
      try {
        for (int64_t micro = 0; micro < cfg.train.grad_accum; ++micro) {
          Batch b = train_loader->next();
          const int64_t rows = b.inputs.size(0), parts = std::min(oom_parts, rows);
          for (int64_t part = 0; part < parts; ++part) {
            if (engine) engine->begin_micro(micro + 1 == cfg.train.grad_accum && part + 1 == parts);
            if (reducer) reducer->begin_micro(micro + 1 == cfg.train.grad_accum && part + 1 == parts);
            const int64_t r0 = rows * part / parts, r1 = rows * (part + 1) / parts;
            const torch::Tensor inputs = parts == 1 ? b.inputs : b.inputs.narrow(0, r0, r1 - r0);
            const torch::Tensor targets = parts == 1 ? b.targets : b.targets.narrow(0, r0, r1 - r0);
            TORCH_CHECK_WITH(OutOfMemoryError,
                             cfg.train.fault_oom_above_tokens == 0 || inputs.numel() <= cfg.train.fault_oom_above_tokens,
                             "injected out-of-memory: ", inputs.numel(), " tokens in a micro-batch > ",
                             cfg.train.fault_oom_above_tokens, " (train.fault_oom_above_tokens)");
            const double share = double(r1 - r0) / double(rows);
            torch::Tensor loss;
            {
              AutocastGuard ac(device.type(), cfg.train.precision);
              loss = model->loss(model->forward(inputs), targets);
            }
            timer.mark(StepTimer::Phase::kForward);
            // Gradients accumulate in the fp32 .grad of the fp32 parameters (autocast casts weights
            // per op; their gradients arrive in fp32), so accumulation adds no rounding beyond fp32.
            // Note [Data parallel]: weighted by this rank's share of the global batch; the ranks' sum is its mean.
            torch::Tensor scaled = world == 1 ? (parts == 1 ? loss / double(cfg.train.grad_accum)
                                                            : loss * (share / double(cfg.train.grad_accum)))
                                              : loss * (share * rank_share / double(cfg.train.grad_accum));
            if (fp16) scaled = scaled * scale;
            scaled.backward();
            loss_sum += parts == 1 ? loss.detach() : loss.detach() * share;
            timer.mark(StepTimer::Phase::kBackward);
          }
        }
        break;
      } catch (const c10::OutOfMemoryError& e) {
        const std::string what = one_line(e.what_without_backtrace());
        TANDEM_CHECK(cfg.train.oom_retry, "out of memory at step ", step + 1, " (", what,
                     "); lower train.micro_batch, set model.checkpointing=true, or set train.oom_retry=true");
        if (engine) engine->abandon_step();
        optimizer.zero_grad();
        if (device_index >= 0 && accelerator()) accelerator()->empty_cache(device_index);
        train_loader->seek(data_pos0);
        TANDEM_CHECK(oom_parts * 2 <= cfg.train.micro_batch, "out of memory at step ", step + 1,
                     " even at micro-batch ", cfg.train.micro_batch / oom_parts, " (", what,
                     "); lower train.seq_len, set model.checkpointing=true or offload.optimizer=cpu");
        oom_parts *= 2;
        oom_clean_steps = 0;
        ++summary.oom_retries;
        const int64_t mb = (cfg.train.micro_batch + oom_parts - 1) / oom_parts;
        log::warn(strprintf("out of memory at step %lld: retrying it with micro-batch %lld x %lld accumulation "
                            "(same %lld tokens per step)",
                            static_cast<long long>(step + 1), static_cast<long long>(mb),
                            static_cast<long long>(cfg.train.grad_accum * oom_parts),
                            static_cast<long long>(tokens_per_step)));
        publish({{"step", step + 1}, {"oom", what}, {"micro_batch_effective", mb},
                 {"grad_accum_effective", cfg.train.grad_accum * oom_parts}});
      }
    }
    torch::Tensor found_inf = torch::zeros({}, fopts), norm;
    if (engine) {
      // Norm, clipping, the non-finite check and the GPU-updated Blocks (Note [Speculative clipping]).
      const StepOutcome out = engine->end_step();
      norm = torch::full({}, out.grad_norm, fopts);
      found_inf.fill_(out.skipped ? 1.0 : 0.0);
    } else {
      if (reducer) reducer->finish();  // every Block's gradient summed over the ranks
      std::vector<torch::Tensor> grads;
      for (auto& p : params)
        if (p.grad().defined()) grads.push_back(p.grad());
      if (fp16) at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, scale.reciprocal());
      // Global norm of all gradients, without a host synchronisation.
      norm = torch::linalg_vector_norm(torch::stack(at::_foreach_norm(grads, 2)), 2);
      found_inf = torch::maximum(found_inf, (~torch::isfinite(norm)).to(torch::kFloat32));
      if (cfg.train.grad_clip > 0) {
        auto coef = torch::clamp_max(cfg.train.grad_clip / (norm + 1e-6), 1.0);
        at::_foreach_mul_(grads, coef);
      }
      optimizer.step(lr, found_inf);
      optimizer.zero_grad();
    }
    if (fp16 && cfg.scaler.dynamic) {
      at::_amp_update_scale_(scale, growth_tracker, found_inf, cfg.scaler.growth_factor, cfg.scaler.backoff_factor,
                             cfg.scaler.growth_interval);
      scale.clamp_min_(cfg.scaler.min_scale);
    }
    timer.mark(StepTimer::Phase::kUpdate);
    // One host synchronisation per step.
    auto host =
        torch::stack({loss_sum / double(cfg.train.grad_accum), norm.to(torch::kFloat32), found_inf, scale.squeeze()})
            .to(torch::kCPU, torch::kFloat64);
    double loss_v = host[0].item<double>();
    const double norm_v = host[1].item<double>();
    bool stop_now = stop_requested();
    if (comm) {
      // The global batch's loss, and one decision to stop: every rank stops after the same step.
      const auto sums = comm->sum({loss_v * rank_share, stop_now ? 1.0 : 0.0});
      loss_v = sums[0];
      stop_now = sums[1] > 0;
    }
    const bool skipped = host[2].item<double>() != 0.0;
    const double scale_v = host[3].item<double>();
    // Pacing toward a GPU power budget (Note [Placement policies]): the GPU idles, the step's time counts it.
    if (placement && placement->pace_s() > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(placement->pace_s()));
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    state.step = step + 1;
    state.tokens_seen += tokens_per_step;
    if (skipped) ++summary.skipped_steps;
    summary.losses.push_back(loss_v);
    step_times.push_back(dt);

    nlohmann::json m = {{"step", state.step},
                        {"loss", loss_v},
                        {"lr", lr},
                        {"grad_norm", norm_v},
                        {"step_time_s", dt},
                        {"tokens_per_s", tokens_per_step / dt},
                        {"tokens", state.tokens_seen},
                        {"mem_host_peak_bytes", host_peak_rss_bytes()},
                        {"t_s", std::chrono::duration<double>(Clock::now() - run_start).count()}};
    const StepPhases phases = timer.read(dt);
    m["time_forward_s"] = phases.forward_s;
    m["time_backward_s"] = phases.backward_s;
    m["time_update_s"] = phases.update_s;
    m["time_idle_s"] = phases.idle_s;
    if (device_index >= 0 && accelerator()) {
      const auto ms = accelerator()->memory_stats(device_index);
      m["mem_device_bytes"] = ms.allocated;
      m["mem_device_peak_bytes"] = ms.peak_allocated;
      m["mem_device_reserved_bytes"] = ms.reserved;
    }
    if (fp16) m["loss_scale"] = scale_v;
    if (oom_parts > 1) {
      m["micro_batch_effective"] = (cfg.train.micro_batch + oom_parts - 1) / oom_parts;
      if (cfg.train.oom_grow_after > 0 && ++oom_clean_steps >= cfg.train.oom_grow_after) {
        oom_parts /= 2;
        oom_clean_steps = 0;
        log::info(strprintf("%lld clean steps: trying micro-batch %lld again",
                            static_cast<long long>(cfg.train.oom_grow_after),
                            static_cast<long long>((cfg.train.micro_batch + oom_parts - 1) / oom_parts)));
      }
    }
    if (skipped) m["skipped"] = true;
    tokens_run += tokens_per_step;
    std::optional<double> step_gpu_j, step_cpu_j;
    if (sampler) {
      const EnergyCounters e = sampler->energy_now();
      if (e.gpu_j && energy_prev.gpu_j) step_gpu_j = *e.gpu_j - *energy_prev.gpu_j;
      if (e.cpu_j && energy_prev.cpu_j) step_cpu_j = *e.cpu_j - *energy_prev.cpu_j;
      if (e.gpu_j && energy_prev.gpu_j) {
        m["energy_gpu_j"] = *e.gpu_j - *energy_prev.gpu_j;
        m["energy_gpu_j_per_token"] = (*e.gpu_j - *energy_prev.gpu_j) / double(tokens_per_step);
      }
      if (e.cpu_j && energy_prev.cpu_j) {
        m["energy_cpu_j"] = *e.cpu_j - *energy_prev.cpu_j;
        m["energy_cpu_j_per_token"] = (*e.cpu_j - *energy_prev.cpu_j) / double(tokens_per_step);
      }
      energy_prev = e;
      nlohmann::json t = telemetry_json(sampler->latest());
      t.erase("cpu_core_pct");  // per core: live endpoints only, not one column per core per row
      m.update(t);
    }
    if (engine) {
      const EngineStats es = engine->stats();
      m["time_cpu_update_s"] = es.cpu_update_s - stats0.cpu_update_s;
      m["time_transfer_s"] = es.transfer_s - stats0.transfer_s;
      m["offload_gpu_blocks"] = store->gpu_blocks();
      m["offload_rollbacks"] = es.rollbacks;
      m["offload_cpu_update_s"] = es.cpu_update_s;
      const auto& sp = engine->split();
      if (sp.solved) {
        m["offload_k"] = sp.k;
        m["offload_alpha"] = sp.alpha;
        m["offload_predicted_step_s"] = sp.predicted_step_s;
      }
    }
    if (comm) m["dist_rows"] = rank_rows;
    if (placement) placement->after_step(dt, step_gpu_j, step_cpu_j, m);
    publish(m);
    // Fault injection for the tests of Note [Launcher]: "RANK:STEP" kills (or, with TANDEM_FAULT_STOP,
    // stops) that rank after that step, in the first attempt only, or in every attempt with
    // TANDEM_FAULT_ALWAYS (a broken GPU).
    if (const char* f = std::getenv("TANDEM_FAULT_AT");
        f && (ranks.restart_count == 0 || std::getenv("TANDEM_FAULT_ALWAYS") != nullptr)) {
      const auto parts = split(f, ':');
      if (parts.size() == 2 && std::atoi(parts[0].c_str()) == ranks.rank && std::atoll(parts[1].c_str()) == state.step)
        ::raise(std::getenv("TANDEM_FAULT_STOP") ? SIGSTOP : SIGKILL);
    }

    // Note [Data parallel]: dist.balance=auto measures, then sizes each rank's rows once.
    compute_s.push_back(phases.forward_s + phases.backward_s);
    if (comm && cfg.dist.balance == "auto" && state.step == summary.first_step + cfg.dist.balance_after) {
      const double mine = median(compute_s) / double(rank_rows[static_cast<size_t>(ranks.rank)]);
      double max_rows = double(global_rows);
      if (device_index >= 0 && accelerator()) {
        const auto ms = accelerator()->memory_stats(device_index);
        // Activation memory per row from the step's peak over the memory held between steps.
        const double per_row = std::max(
            1.0, double(ms.peak_allocated - ms.allocated) / double(rank_rows[static_cast<size_t>(ranks.rank)]));
        const double room = double(ms.total) * cfg.offload.gpu_memory_fraction - double(ms.peak_allocated);
        max_rows =
            std::min(max_rows, double(rank_rows[static_cast<size_t>(ranks.rank)]) + std::max(0.0, room) / per_row);
      }
      const auto speeds = comm->all_gather(mine);
      const auto caps_d = comm->all_gather(max_rows);
      std::vector<int64_t> caps;
      for (const double c : caps_d) caps.push_back(static_cast<int64_t>(c));
      const auto next = balance_rows(speeds, caps, global_rows);
      if (next != rank_rows) {
        std::string said;
        for (int r = 0; r < world; ++r)
          said += strprintf("%srank %d: %.3g ms/row -> %lld rows", r ? ", " : "", r, speeds[r] * 1e3,
                            static_cast<long long>(next[static_cast<size_t>(r)]));
        log::info("dist.balance=auto: " + said);
        rank_rows = next;
        rank_share = double(rank_rows[static_cast<size_t>(ranks.rank)]) / double(global_rows);
        const int64_t pos = train_loader->position();
        train_loader = std::make_unique<BatchLoader>(data.train, rank_rows[static_cast<size_t>(ranks.rank)], seq_len,
                                                     cfg.train.seed, device, cfg.data.prefetch, spec.vocab_size,
                                                     "training", first_row_of(ranks.rank));
        train_loader->seek(pos);
      }
    }

    ProgressSample ps;
    ps.step = state.step, ps.total = cfg.train.steps, ps.loss = loss_v, ps.lr = lr;
    ps.tokens_per_s =
        tokens_per_step /
        median(std::vector<double>(step_times.end() - std::min<size_t>(step_times.size(), 20), step_times.end()));
    ps.step_time_s = dt;
    ps.eta_s = double(cfg.train.steps - state.step) * tokens_per_step / ps.tokens_per_s;
    if (skipped)
      ps.extra = fp16 ? strprintf("overflow, step skipped, scale %g", scale_v) : "non-finite gradients, step skipped";
    else if (fp16)
      ps.extra = strprintf("scale %g", scale_v);
    progress.update(ps);

    if (val_loader && main_rank && state.step % cfg.train.eval_every == 0) {
      summary.last_eval_loss = evaluate();
      publish({{"step", state.step}, {"eval_loss", summary.last_eval_loss}});
      progress.message(
          strprintf("step %lld | eval loss %.4f", static_cast<long long>(state.step), summary.last_eval_loss));
    }
    if (cfg.train.checkpoint_every > 0 && state.step % cfg.train.checkpoint_every == 0 && state.step < cfg.train.steps)
      checkpoint(true);
    collect_checkpoint(false);
    // Note [Stopping on a signal]
    // SIGINT/SIGTERM set a flag (core/interrupt.h); the step in flight finishes, the loop stops
    // here, a checkpoint is written whatever train.save_final says, and the run ends normally
    // (exit 0), so `--resume` continues exactly. A second signal ends the process at once.
    if (stop_now && state.step < cfg.train.steps) {
      summary.interrupted = true;
      log::warn(strprintf("stop requested: stopping after step %lld of %lld", static_cast<long long>(state.step),
                          static_cast<long long>(cfg.train.steps)));
      break;
    }
  }
  progress.finish();
  const double wall = std::chrono::duration<double>(Clock::now() - run_start).count();

  if (val_loader && main_rank && !summary.interrupted &&
      (summary.last_eval_loss < 0 || state.step % cfg.train.eval_every != 0) && state.step > summary.first_step) {
    summary.last_eval_loss = evaluate();
    publish({{"step", state.step}, {"eval_loss", summary.last_eval_loss}});
  }
  // The last checkpoint is written in place: nothing is left to overlap it.
  const bool final_wanted = (cfg.train.save_final || summary.interrupted) && state.step > summary.first_step;
  if (final_wanted) checkpoint(false);
  collect_checkpoint(true);
  // A run that ends without its final checkpoint, or with every checkpoint failed, lost work: the
  // CLI reports it loudly and exits non-zero (Note [Checkpoint failures]).
  const std::string final_name = step_name(state.step);
  summary.unsaved = !summary.checkpoint_error.empty() &&
                    ((final_wanted && fs::path(summary.last_checkpoint).filename() != final_name) ||
                     summary.last_checkpoint.empty());

  summary.final_step = state.step;
  nlohmann::json telemetry = nlohmann::json::object();
  if (sampler) {
    const double loop_s = std::chrono::duration<double>(Clock::now() - loop_start).count();
    const EnergyCounters e = sampler->energy_now();
    if (e.gpu_j && energy0.gpu_j && tokens_run > 0) {
      telemetry["energy_gpu_j"] = *e.gpu_j - *energy0.gpu_j;
      telemetry["energy_gpu_j_per_token"] = (*e.gpu_j - *energy0.gpu_j) / double(tokens_run);
    }
    if (e.cpu_j && energy0.cpu_j && tokens_run > 0) {
      telemetry["energy_cpu_j"] = *e.cpu_j - *energy0.cpu_j;
      telemetry["energy_cpu_j_per_token"] = (*e.cpu_j - *energy0.cpu_j) / double(tokens_run);
    }
    telemetry["samples"] = sampler->samples();
    telemetry["period_s"] = cfg.monitor.period_s;
    // The sampler's own cost: its thread's CPU time over the loop's wall time (one core's share).
    telemetry["sampler_cpu_s"] = sampler->thread_cpu_s() - sampler_cpu0;
    telemetry["sampler_cpu_fraction"] = loop_s > 0 ? (sampler->thread_cpu_s() - sampler_cpu0) / loop_s : 0.0;
    telemetry["missing"] = sampler->why_missing();
    sampler.reset();
  }
  // Median over steps after the first few (warm-up: allocator, cuDNN/cuBLAS heuristics).
  std::vector<double> steady(step_times.begin() + std::min<size_t>(step_times.size() / 5, 5), step_times.end());
  summary.median_step_time_s = median(steady);
  summary.median_tokens_per_s = summary.median_step_time_s > 0 ? tokens_per_step / summary.median_step_time_s : 0;
  summary.peak_host_bytes = host_peak_rss_bytes();
  if (device_index >= 0 && accelerator())
    summary.peak_device_bytes = accelerator()->memory_stats(device_index).peak_allocated;

  nlohmann::json s = {{"steps", summary.final_step - summary.first_step},
                      {"final_step", summary.final_step},
                      {"final_loss", summary.losses.empty() ? 0.0 : summary.losses.back()},
                      {"eval_loss", summary.last_eval_loss},
                      {"median_step_time_s", summary.median_step_time_s},
                      {"median_tokens_per_s", summary.median_tokens_per_s},
                      {"tokens_per_step", tokens_per_step},
                      {"params", spec.num_params_unpadded()},
                      {"n_layer", spec.n_layer},
                      {"d_model", spec.d_model},
                      {"seq_len", seq_len},
                      {"precision", to_string(cfg.train.precision)},
                      {"device", device.str()},
                      {"wall_s", wall},
                      {"skipped_steps", summary.skipped_steps},
                      {"peak_device_bytes", summary.peak_device_bytes},
                      {"peak_host_bytes", summary.peak_host_bytes},
                      {"checkpoint", summary.last_checkpoint},
                      {"interrupted", summary.interrupted},
                      {"oom_retries", summary.oom_retries},
                      {"checkpoint_error", summary.checkpoint_error},
                      {"unsaved", summary.unsaved},
                      {"telemetry", telemetry}};
  if (placement) s["placement"] = placement->summary();
  if (main_rank) write_file_atomic((fs::path(run_dir) / "summary.json").string(), s.dump(2) + "\n");
  if (comm) {
    // Every rank stops its heartbeat before rank 0, which serves the store, may exit.
    comm->stop_heartbeat();
    comm->barrier();
  }
  feed.finish();
  // An open dashboard polls every second: give it the last rows before the server goes.
  if (cfg.monitor.dashboard_port > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  if (telemetry.contains("energy_gpu_j_per_token"))
    log::info(strprintf("energy: GPU %.1f kJ, %.3f J/token%s", telemetry["energy_gpu_j"].get<double>() / 1e3,
                        telemetry["energy_gpu_j_per_token"].get<double>(),
                        telemetry.contains("energy_cpu_j_per_token")
                            ? strprintf(" | CPU %.1f kJ, %.3f J/token", telemetry["energy_cpu_j"].get<double>() / 1e3,
                                        telemetry["energy_cpu_j_per_token"].get<double>())
                                  .c_str()
                            : ""));
  if (!summary.losses.empty()) {
    log::info(strprintf(
        "done: %lld steps in %s | loss %.4f -> %.4f%s | %s tok/s median | peak memory %s",
        static_cast<long long>(summary.final_step - summary.first_step), format_duration(wall).c_str(),
        summary.losses.front(), summary.losses.back(),
        summary.last_eval_loss >= 0 ? strprintf(" | eval %.4f", summary.last_eval_loss).c_str() : "",
        format_count(summary.median_tokens_per_s).c_str(),
        format_bytes(double(device_index >= 0 ? summary.peak_device_bytes : summary.peak_host_bytes)).c_str()));
  } else {
    log::info(strprintf("nothing to do: already at step %lld of train.steps=%lld", static_cast<long long>(state.step),
                        static_cast<long long>(cfg.train.steps)));
  }
  return summary;
}

}  // namespace

}  // namespace tandem
