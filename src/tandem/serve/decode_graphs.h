#pragma once
// Decode steps replayed from recordings of the decoder's forward (CUDA graphs).
//
// Note [Decode graphs]
// A decode step of a model whose layers are all resident is bound by the host that launches its
// kernels, not by the device: a 1B model's step is about a thousand kernels that read 2 GiB of
// weights in well under a millisecond between them. DecodeGraphs records the step once per shape
// (Note [Recorded device work]) and replays it, one launch per step.
// - Shapes. The batch is padded up to a bucket (1, 2, 4, 8, then multiples of 8) and the page
//   tables to a power of two pages (at most the context's), so a few dozen recordings cover a run.
// - Padding. A padded row decodes token 0 at position 0, writes its keys and values into the
//   cache's scratch page (KvCache::scratch_page), attends to that one key and its logits are
//   dropped. A real row's page table is padded with the scratch page, masked out by its length.
// - Memory. The recordings of one DecodeGraphs share one pool (the first recording's); each step
//   reads its logits before the next replay.
// - Inputs. A step's tokens, positions, write places, lengths and page tables go to the device in
//   one copy, into the tensors the recording reads (Decoder::decode_layout).
// - What runs eagerly. Steps that prefill (a chunk of several tokens), models with streamed
//   layers (a streamed layer waits on the host) and models with dynamic RoPE (whose table follows
//   the sequences' length) run through Decoder::forward. A recording that
//   fails turns recording off for the rest of the run with one warning; the step then runs eagerly.
// Padding changes only which masked keys the attention skips, so a replayed step's logits equal
// the eager step's up to summation order (tests/serve/decode_graphs_test.cpp).

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "tandem/core/device_graph.h"
#include "tandem/serve/decoder.h"
#include "tandem/serve/kv_cache.h"

namespace tandem {

/// Decode steps of one decoder over one KV cache (Note [Decode graphs]); one thread at a time.
class DecodeGraphs {
 public:
  /// Records with `recorder`; nullptr runs the same padded step eagerly (no recording: the CPU,
  /// and the tests of the padding). `decoder` and `cache` must outlive this object.
  DecodeGraphs(Decoder& decoder, KvCache& cache, GraphRecorder* recorder);
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;
  ~DecodeGraphs();

  /// Whether forward() takes `batch`: every chunk adds one token, and recording has not failed.
  bool takes(const std::vector<SequenceChunk>& batch) const;
  /// The step's fp32 logits (B, V) in the order of `batch`, valid until the next forward(). Writes
  /// each chunk's keys and values into the cache, as Decoder::forward does.
  torch::Tensor forward(const std::vector<SequenceChunk>& batch);

  /// Recordings made so far, and steps replayed from them.
  int64_t recordings() const { return recordings_; }
  int64_t replays() const { return replays_; }

  /// The padded shapes of a step: a batch of `batch` sequences whose longest table has `pages`
  /// pages, with at most `max_pages` pages a sequence.
  static int64_t batch_bucket(int64_t batch);
  static int64_t pages_bucket(int64_t pages, int64_t max_pages);

 private:
  struct Recording;
  Recording& recording_for(int64_t batch, int64_t pages);
  void write_inputs(const std::vector<SequenceChunk>& batch, Recording& r) const;

  Decoder& decoder_;
  KvCache& cache_;
  GraphRecorder* recorder_;
  int64_t max_pages_ = 0;
  bool failed_ = false;
  const DeviceGraph* pool_owner_ = nullptr;  // the first recording: every other one shares its memory pool
  int64_t recordings_ = 0, replays_ = 0;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Recording>> recorded_;
};

}  // namespace tandem
