#pragma once
// Device work recorded once and replayed as one launch (CUDA graphs), behind a narrow interface (no
// CUDA headers here): the CUDA implementation registers itself when tandem is built with CUDA; a
// CPU-only build has none, and callers run their work eagerly.
//
// Note [Recorded device work]
// A step made of many small kernels is bound by the host that launches them, not by the device
// (a decode step of a 1B model: about a thousand kernels, each reading little). Recording the step
// once and replaying the recording launches all of it at once. What a recording reads and writes
// is fixed at record time: the addresses of its input tensors, its outputs and everything it
// allocates, which come from a memory pool that recordings may share (a pool lives as long as
// one of its recordings, and its memory goes back only when all are gone). So a caller (a) writes
// each step's inputs into the same tensors before replay(), (b) reads the outputs of a replay
// before replaying another recording of the same pool (one recording's scratch may be another's
// output), and (c) keeps no host-side decision inside the work: a branch
// taken at record time is taken at every replay, and work that waits for the device (a copy to the
// host, .item()) cannot be recorded at all (record() then throws and nothing is kept).

#include <functional>
#include <memory>

namespace tandem {

/// One recording (Note [Recorded device work]).
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  /// Queues the recorded work on the device's current stream.
  virtual void replay() = 0;
};

/// Makes recordings on one kind of device.
class GraphRecorder {
 public:
  virtual ~GraphRecorder() = default;
  /// Runs `work` once on a side stream of device `index` (warming up what it initialises lazily),
  /// then records what it queues when run again. The work has run, the recording has not: replay()
  /// to get its results. What the recording allocates comes from the memory pool of
  /// `share_memory_with` (a live recording of this recorder), or from a new pool. Throws what the
  /// work or the recording throws; nothing is kept then.
  virtual std::unique_ptr<DeviceGraph> record(int index, const std::function<void()>& work,
                                              const DeviceGraph* share_memory_with = nullptr) = 0;
};

/// The registered recorder, or nullptr (CPU-only build).
GraphRecorder* graph_recorder();

/// Called once by the recorder's translation unit at static initialisation.
void register_graph_recorder(std::unique_ptr<GraphRecorder> recorder);

}  // namespace tandem
