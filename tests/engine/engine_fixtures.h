#pragma once
// The small LLaMA-style model the engine tests share: a few layers of width 64 with grouped-query
// attention, a 100-token vocabulary (padded to 128) and sequences of up to 32 tokens.

#include <cstdint>
#include <memory>

#include "tandem/models/model.h"
#include "tandem/models/spec.h"

namespace tandem::test {

// Named apart from tests/serve's small_llama_spec(vocab): two inline functions of one signature in
// one namespace would be one function to the linker (the other file's tests then run a wrong model).
inline ModelSpec small_engine_spec(int64_t n_layer) {
  ModelSpec s = preset_spec("tiny");
  s.n_layer = n_layer;
  s.d_model = 64;
  s.n_head = 4;
  s.n_kv_head = 2;
  s.d_ff = 128;
  s.vocab_size = 100;
  s.max_seq_len = 32;
  return s;
}

/// The small model of small_engine_spec(n_layer), built from seed 7.
inline std::shared_ptr<Model> small_engine_model(int64_t n_layer) {
  torch::manual_seed(7);
  return build_model(small_engine_spec(n_layer), false);
}

}  // namespace tandem::test
