#pragma once
// The configuration's keyword-or-value keys, each parsed once where the key is set (config_keys)
// into a value the code reads by kind, never by comparing strings; each writes itself back as the
// user would (str()). What needs the run to check (the world size, the model's Blocks) is checked
// where the run is known.

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/core/device_spec.h"

namespace tandem {

/// dist.balance: rows of the global micro-batch per rank.
struct RowBalance {
  enum class Kind { kEqual, kAuto, kGiven };
  Kind kind = Kind::kEqual;  ///< kAuto: rebalanced from measured speed and memory (dist.balance_after)
  std::vector<int64_t> rows;  ///< kGiven: one count per rank, each >= 1
  /// "equal" | "auto" | a comma list of row counts; UserError naming `key` and the accepted forms.
  static RowBalance parse(const std::string& text, const std::string& key = "dist.balance");
  std::string str() const;
};

/// dist.pipeline_cut: where the pipeline's stages end.
struct PipelineCut {
  enum class Kind { kPartitioner, kEven, kGiven };
  Kind kind = Kind::kPartitioner;  ///< the partitioner's cut (Note [Pipeline partition])
  std::vector<int64_t> ends;       ///< kGiven: the end Block of each stage but the last
  /// "" | "even" | a comma list of Block indices.
  static PipelineCut parse(const std::string& text, const std::string& key = "dist.pipeline_cut");
  std::string str() const;
};

/// dist.pipeline_devices: each pipeline stage's device; empty = every stage on train.device.
struct StageDevices {
  std::vector<DeviceSpec> devices;
  /// "" | a comma list of devices (auto, cpu, cuda, cuda:N).
  static StageDevices parse(const std::string& text, const std::string& key = "dist.pipeline_devices");
  std::string str() const;
  bool empty() const { return devices.empty(); }
  /// Whether a stage computes on the host (seed 000's hybrid: the stages then meet through Gloo).
  bool any_cpu() const;
};

/// placement.blocks: where the static placement runs each Block.
struct StaticBlocks {
  enum class Kind { kGpu, kCpu, kLetters };
  Kind kind = Kind::kGpu;  ///< kCpu: every movable Block on the CPU
  std::vector<bool> on_cpu;  ///< kLetters: per Block, from G (false) or C (true)
  /// "gpu" | "cpu" | one letter per Block, G or C.
  static StaticBlocks parse(const std::string& text, const std::string& key = "placement.blocks");
  std::string str() const;
};

/// placement.movable: the Blocks that may run on the CPU.
struct MovableBlocks {
  enum class Kind { kLayers, kNone, kGiven };
  Kind kind = Kind::kLayers;    ///< every decoder layer
  std::vector<int64_t> blocks;  ///< kGiven: Block indices (0 = the embedding)
  /// "" | "none" | a comma list of Block indices.
  static MovableBlocks parse(const std::string& text, const std::string& key = "placement.movable");
  std::string str() const;
};

}  // namespace tandem
