#include "tandem/serve/decode_graphs.h"

#include <algorithm>

#include "tandem/core/error.h"
#include "tandem/core/log.h"

namespace tandem {

/// One padded shape: its input tensors (views of one flat device buffer), and, once recorded, the
/// recording and the logits it writes.
struct DecodeGraphs::Recording {
  int64_t batch = 0, pages = 0;
  torch::Tensor flat;  // (5 B + B P) int64: tokens, positions, write pages, write slots, lengths, tables
  DecodeInputs inputs;
  torch::Tensor logits;       // (B, V) fp32, written by each replay
  std::vector<int64_t> host;  // the inputs as written on the host, copied into `flat` each step
  std::unique_ptr<DeviceGraph> graph;
};

DecodeGraphs::DecodeGraphs(Decoder& decoder, KvCache& cache, GraphRecorder* recorder)
    : decoder_(decoder), cache_(cache), recorder_(recorder) {
  max_pages_ = cache_.pages_for(std::min(decoder_.spec().max_seq_len, cache_.tokens_total()));
  decoder_.prepare_decode_step(cache_);  // Note [Persistent decode step]: before any recording
}

DecodeGraphs::~DecodeGraphs() = default;

int64_t DecodeGraphs::batch_bucket(int64_t batch) {
  if (batch <= 8) {
    int64_t b = 1;
    while (b < batch) b *= 2;
    return b;
  }
  return (batch + 7) / 8 * 8;
}

int64_t DecodeGraphs::pages_bucket(int64_t pages, int64_t max_pages) {
  int64_t p = 1;
  while (p < pages) p *= 2;
  return std::max<int64_t>(std::min(p, max_pages), pages);
}

bool DecodeGraphs::takes(const std::vector<SequenceChunk>& batch) const {
  // A dynamic RoPE's table follows the sequences' length, which a recording cannot.
  const bool dynamic_rope = decoder_.spec().rope_scaling.type == RopeType::kDynamic;
  return !failed_ && !dynamic_rope && !batch.empty() &&
         std::all_of(batch.begin(), batch.end(), [](const SequenceChunk& c) { return c.tokens.size() == 1; });
}

DecodeGraphs::Recording& DecodeGraphs::recording_for(int64_t batch, int64_t pages) {
  auto& slot = recorded_[{batch, pages}];
  if (!slot) {
    slot = std::make_unique<Recording>();
    auto& r = *slot;
    r.batch = batch, r.pages = pages;
    r.flat = torch::zeros({5 * batch + batch * pages},
                          torch::TensorOptions().dtype(torch::kInt64).device(decoder_.device()));
    auto& in = r.inputs;
    in.tokens = r.flat.narrow(0, 0, batch);
    in.positions = r.flat.narrow(0, batch, batch);
    in.write_page = r.flat.narrow(0, 2 * batch, batch);
    in.write_slot = r.flat.narrow(0, 3 * batch, batch);
    in.lengths = r.flat.narrow(0, 4 * batch, batch);
    in.pages = r.flat.narrow(0, 5 * batch, batch * pages).view({batch, pages});
  }
  return *slot;
}

void DecodeGraphs::write_inputs(const std::vector<SequenceChunk>& batch, Recording& r) const {
  const int64_t B = r.batch, P = r.pages, pt = cache_.page_tokens(), scratch = cache_.scratch_page();
  auto& host = r.host;
  host.assign(static_cast<size_t>(5 * B + B * P), 0);
  const auto at = [&](int64_t field, int64_t row) -> int64_t& { return host[static_cast<size_t>(field * B + row)]; };
  for (int64_t b = 0; b < B; ++b) {
    int64_t* table = &host[static_cast<size_t>(5 * B + b * P)];
    std::fill(table, table + P, scratch);
    if (b >= static_cast<int64_t>(batch.size())) {  // padding: token 0 at position 0 in the scratch page
      at(2, b) = scratch, at(4, b) = 1;
      continue;
    }
    const auto& c = batch[static_cast<size_t>(b)];
    const int64_t used = cache_.pages_for(c.start + 1);
    TANDEM_ASSERT(c.pages != nullptr && c.pages->capacity(pt) >= c.start + 1 && used <= P, "page table for ",
                  c.start + 1, " tokens in a step of ", P, " pages");
    TANDEM_ASSERT(c.start + 1 <= decoder_.spec().max_seq_len, "sequence beyond the context");
    const TokenId id = c.tokens[0];
    TANDEM_ASSERT(id >= 0 && id < decoder_.spec().vocab_size, "token id ", id, " outside the vocabulary");
    at(0, b) = id;
    at(1, b) = c.start;
    at(2, b) = c.pages->pages[static_cast<size_t>(c.start / pt)];
    at(3, b) = c.start % pt;
    at(4, b) = c.start + 1;
    std::copy(c.pages->pages.begin(), c.pages->pages.begin() + used, table);
  }
  r.flat.copy_(torch::from_blob(host.data(), {static_cast<int64_t>(host.size())}, torch::kInt64));
}

torch::Tensor DecodeGraphs::forward(const std::vector<SequenceChunk>& batch) {
  TANDEM_ASSERT(takes(batch), "a step that is not a decode step, or recording has failed");
  const c10::InferenceMode inference;
  int64_t widest = 0;
  for (const auto& c : batch) widest = std::max(widest, cache_.pages_for(c.start + 1));
  const auto B = static_cast<int64_t>(batch.size());
  Recording& r = recording_for(batch_bucket(B), pages_bucket(widest, max_pages_));
  write_inputs(batch, r);
  const auto step = [&] { r.logits = decoder_.run(decoder_.decode_layout(r.inputs, cache_), cache_); };
  if (recorder_ == nullptr) {
    step();
    return r.logits.narrow(0, 0, B);
  }
  if (!r.graph) {
    try {
      r.graph = recorder_->record(
          decoder_.device().index(),
          [&] {
            const c10::InferenceMode in_recording;
            step();
          },
          pool_owner_);
      if (pool_owner_ == nullptr) pool_owner_ = r.graph.get();
      ++recordings_;
    } catch (const std::exception& e) {
      log::warn(std::string("decode steps run without CUDA graphs: recording one failed: ") + e.what());
      failed_ = true;
      recorded_.clear();
      pool_owner_ = nullptr;
      return decoder_.forward(batch, cache_);
    }
  }
  r.graph->replay();
  ++replays_;
  return r.logits.narrow(0, 0, B);
}

}  // namespace tandem
