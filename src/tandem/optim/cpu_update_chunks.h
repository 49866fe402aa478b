#pragma once
// The chunked driver of the CPU update (optim/cpu_update.cpp), which cpu_retract_and_update
// (optim/cpu_retract.cpp) also runs, with a retraction of each chunk just before its update.

#include <functional>
#include <vector>

#include "tandem/optim/cpu_update.h"

namespace tandem::detail {

/// Elements of a span one pool task updates: a few hundred KiB a buffer, so a chunk stays in L2
/// while it is read, updated and written; a multiple of the update's tile and of an 8-bit block.
constexpr int64_t kUpdateChunk = 1 << 16;

/// Work on one chunk: its span's index and [begin, end) of that span's elements.
using ChunkFn = std::function<void(size_t span, int64_t begin, int64_t end)>;

/// Runs `f` on every chunk of every span, the chunks spread over `pool` (the global pool when null):
/// the cut that the update, its rollback and the retraction share.
void for_each_chunk(const std::vector<UpdateSpan>& spans, CpuThreadPool* pool, const ChunkFn& f);

/// The update's report, and the thread-seconds its chunks spent in `before` and in the update
/// (both 0 without a `before`).
struct ChunkedUpdate {
  UpdateReport report;
  double before_s = 0.0, update_s = 0.0;
};

/// cpu_update on `isa`, with `before` (when set) run on each chunk first, on the chunk's pool thread.
ChunkedUpdate update_in_chunks(const std::vector<UpdateSpan>& spans, const UpdateHyper& hyper,
                               const std::vector<UndoLog>* undo, CpuThreadPool* pool, CpuIsa isa,
                               const ChunkFn& before);

}  // namespace tandem::detail
