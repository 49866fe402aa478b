#pragma once
// The Python engine's step, in C++ (Note [Python engine]): the same collaborators as the CLI's
// trainer (run context, offload engine or the resident optimizer, gradient reducer, loss scale,
// learning-rate schedule, checkpoints), driven by the user's own training loop through the hooks
// and calls of the `tandem` package.

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/core/config.h"
#include "tandem/engine/offload_engine.h"
#include "tandem/python/module_blocks.h"
#include "tandem/run/checkpointer.h"
#include "tandem/run/step_driver.h"
#include "tandem/run/trainer.h"  // TrainSummary

namespace tandem {

class Checkpointer;
class GradReducer;
class NumericsGuard;
class Optimizer;
class RunMetrics;
struct HostShare;
struct OffloadParts;
struct RunContext;

/// What update() did.
struct StepInfo {
  int64_t step = 0;         ///< optimizer steps completed
  bool skipped = false;     ///< a non-finite gradient: nothing was updated
  double grad_norm = 0.0;   ///< the global norm before clipping
  double lr = 0.0;          ///< the step's learning rate
  double loss_scale = 1.0;  ///< the loss scale for the next step (fp16)
  double loss = NAN;        ///< the step's mean loss on this rank; NaN when the engine did not see it
};

class EngineCore {
 public:
  /// Opens the run context (rank, device, rendezvous under torchrun or tandem launch) and builds
  /// the offload engine (offload.optimizer=cpu: the parameters become views of its store) or the
  /// resident optimizer over the parameters, which must then be on the device already.
  EngineCore(std::shared_ptr<ModuleBlocks> blocks, Config cfg, std::string run_dir);
  ~EngineCore();
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  /// Before a forward that records gradients: on the first micro-batch of a step the step begins
  /// at `lr` (nullopt: the config's schedule); each micro-batch tells the engine whether it is the
  /// last of the step (Blocks are dispatched as the last backward completes them): `last`, or
  /// (nullopt) whether it completes train.grad_accum micro-batches.
  void begin_forward(std::optional<double> lr, std::optional<bool> last = std::nullopt);
  /// The factor the loss is multiplied by before backward: 1 / accumulation, this rank's share of
  /// the global batch, and the fp16 loss scale.
  double loss_multiplier() const;
  /// After a micro-batch's backward.
  void end_backward();
  /// Micro-batches whose backward ran in the open step, and how many make a step.
  int64_t micro() const { return micro_; }
  int64_t accumulation() const { return cfg_.train.grad_accum; }
  /// The update (norm, clipping, non-finite check, AdamW): ends the open step and publishes its
  /// metrics row (metrics.jsonl, the dashboard and /metrics, TensorBoard) with `loss` (this rank's
  /// mean over the step's micro-batches, a 0-d tensor read with the step's one host copy; nullopt
  /// when unknown) and `tokens` (this rank's). UserError when no backward
  /// ran since the last one.
  StepInfo update(const std::optional<torch::Tensor>& loss, int64_t tokens);
  /// Gives up the open step (an out-of-memory error in the user's forward or backward): nothing is
  /// updated and the gradients are zeroed, so the loop may retry it.
  void abandon();
  /// Note [Adaptive micro-batch] for train_step: after an out-of-memory error in micro-batches of
  /// `rows` rows, the step is abandoned and they are cut into twice as many parts (UserError with
  /// the fix when they cannot be); `parts` of a micro-batch of `rows` rows now; the retries.
  void retry_smaller(const std::string& what, int64_t rows);
  int64_t parts(int64_t rows) const { return driver_->split().parts(rows); }
  int64_t oom_retries() const { return driver_->split().retries(); }

  /// Writes `<run_dir>/checkpoints/step_XXXXXXXX` in the CLI's format and returns its path;
  /// `hf_config` is the model's config.json text ("" = none).
  std::string save(const std::string& run_dir, const std::string& hf_config);
  /// Loads a checkpoint directory or the newest intact one under a run directory: weights, the
  /// optimizer's state, the step, the loss scale and the RNG. Returns the checkpoint's path.
  std::string load(const std::string& path);
  /// Waits until every update is in the working weights (before evaluation or export).
  void wait();

  int64_t step() const { return step_; }
  /// The run directory (rank 0's name on every rank).
  const std::string& run_dir() const { return run_dir_; }
  /// Micro-batches whose backward ran since the start (a checkpoint's data position: `tandem
  /// train` seeks its loader there on resume, and load() restores it).
  int64_t data_position() const { return data_position_; }
  std::string device() const;
  int rank() const;
  int world() const;
  bool offload() const;
  const Config& config() const { return cfg_; }
  /// The engine's counters and the update split, as JSON text.
  std::string stats_json() const;
  /// The run's end, once: the last updates finished, summary.json written (rank 0), the live
  /// endpoints and the sampler stopped. The destructor calls it when Python did not.
  void finish_run();

  /// Note [Parameter groups] (OffloadAdamW, the offload engine in one process): each parameter's
  /// group (the rest: none), and between steps the groups' lr, betas, eps and weight decay for the
  /// next step's updates.
  void assign_groups(const std::vector<std::pair<torch::Tensor, int64_t>>& params);
  void set_group_hypers(const std::vector<GroupHyper>& groups);
  /// One parameter's fp32 master and AdamW moments (host fp32 copies), and setting them (its working
  /// copy from the master) with the update count, between steps.
  std::vector<torch::Tensor> param_state(const torch::Tensor& param);
  void load_param_state(const torch::Tensor& param, const torch::Tensor& master, const torch::Tensor& exp_avg,
                        const torch::Tensor& exp_avg_sq);
  void set_step(int64_t step);
  /// The module's persistent buffers under their state_dict names: saved and loaded with the weights.
  void set_buffers(std::vector<NamedTensor> buffers) { buffers_ = std::move(buffers); }

 private:
  void check_data_parallel_start();
  void publish_step(const StepInfo& info, const StepResult& r, int64_t tokens);
  void write_run_summary();
  bool finished_ = false;
  void widen_split_range();
  void build_offload_engine();
  HostShare host_share() const;
  CheckpointModel checkpoint_model(const std::string& hf_config);
  std::unique_ptr<Checkpointer> checkpointer(const std::string& run_dir, const std::string& hf_config);

  std::shared_ptr<ModuleBlocks> blocks_;
  Config cfg_;
  std::string run_dir_;
  std::unique_ptr<RunContext> ctx_;
  std::unique_ptr<NumericsGuard> numerics_;
  std::unique_ptr<RunMetrics> metrics_;  // Note [Telemetry]: rows, live endpoints, sampler
  std::unique_ptr<OffloadParts> offload_;
  std::unique_ptr<Optimizer> optimizer_;  // the resident optimizer, or the engine's adapter
  std::unique_ptr<GradReducer> reducer_;  // several ranks without the offload engine
  std::unique_ptr<StepDriver> driver_;    // the step's mechanics, as the CLI's trainer
  std::vector<torch::Tensor> params_;     // every trainable tensor once
  std::vector<NamedTensor> buffers_;      // the module's persistent buffers (checkpoints)

  bool open_ = false;     // a step has begun
  int64_t forwards_ = 0;  // forwards that record gradients in the open step (counted toward train.grad_accum)
  int64_t micro_ = 0, step_ = 0, data_position_ = 0;
  double lr_ = 0.0;
  int64_t tokens_seen_ = 0;
  std::chrono::steady_clock::time_point step_start_;
  TrainSummary summary_;            // for summary.json when the engine closes, as the CLI's run writes it
  std::vector<double> step_times_;  // each published step's seconds
  int64_t tokens_run_ = 0, tokens_per_step_ = 0;
};

}  // namespace tandem
