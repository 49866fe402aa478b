#pragma once
// A pipeline step drawn as a trace, one track per stage (Note [Pipeline trace]).
//
// Note [Pipeline trace]
// On the steps dist.pipeline_trace_steps names, every rank's pass times (StageTimes::passes) are
// gathered rank after rank, and rank 0
// writes <run dir>/pipeline_trace.json in Chrome's trace format, which Perfetto loads: one track
// per stage (its first replica's passes), a span per forward ("F3") and backward ("B3") pass, in
// microseconds from the step's earliest pass. The times are each host's wall clock, so stages on
// one host (or NTP-synchronised hosts) line up; a GPU stage's pass ends when its work is queued,
// so the gaps on a track are its waits for a neighbour and for its own device.

#include <cstdint>
#include <string>

namespace tandem {

class Comm;
class Model;
struct PipelineParts;

/// Every rank at once, after step `step` ran: its stages' passes drawn into `path` (rank 0 writes,
/// durably; a failure to write is logged, not thrown).
void write_pipeline_trace(Comm& comm, const PipelineParts& parts, const Model& model, int64_t step,
                          int64_t micro_batches, const std::string& path);

}  // namespace tandem
