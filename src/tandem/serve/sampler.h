#pragma once
// Choosing the next token from a step's logits: greedy, temperature, top-k, top-p and repetition
// penalty, batched on the logits' device, with a scalar reference beside it.
//
// Note [Seeded sampling]
// Each request owns its random stream (SamplingRng, seeded by the request), and a row draws exactly
// one uniform number per token, on the host, whatever else is in the batch. The token is then the
// inverse of the row's cumulative distribution at that number. So a seed repeats its output
// token for token whether the request runs alone or beside others, and on the CPU or a GPU up to the
// rounding of the probabilities.

#include <torch/torch.h>

#include <cstdint>
#include <random>
#include <vector>

#include "tandem/data/tokenizer.h"

namespace tandem {

/// How a request's tokens are chosen (HF's order: penalty, temperature, top-k, top-p).
struct SamplingParams {
  double temperature = 1.0;         ///< 0: greedy (the argmax after the penalty)
  int64_t top_k = 0;                ///< keep the k most likely tokens (ties kept); 0: all
  double top_p = 1.0;               ///< keep the most likely tokens until their mass reaches top_p
  double repetition_penalty = 1.0;  ///< HF's: a seen token's logit divided (> 0) or multiplied (< 0) by it
  uint64_t seed = 0;                ///< the request's random stream (Note [Seeded sampling])
};

/// UserError naming the field and its range when a parameter is out of range.
void check_sampling_params(const SamplingParams& params);

/// A request's random stream (Note [Seeded sampling]).
class SamplingRng {
 public:
  explicit SamplingRng(uint64_t seed) : engine_(seed) {}
  /// The next number in [0, 1).
  double uniform() { return std::generate_canonical<double, 53>(engine_); }

 private:
  std::mt19937_64 engine_;
};

/// One row of a batch: its parameters, the tokens the penalty looks at (prompt and generated) and
/// its uniform number for this token.
struct SamplingRow {
  const SamplingParams* params = nullptr;
  const std::vector<TokenId>* context = nullptr;
  double uniform = 0.0;
};

/// The next token of each row of `logits` (B, V) fp32 on any device, one transfer to the host.
std::vector<TokenId> sample_tokens(const torch::Tensor& logits, const std::vector<SamplingRow>& rows);

/// The scalar reference of sample_tokens for one row of logits (host, double precision).
TokenId sample_token_reference(const std::vector<float>& logits, const SamplingParams& params,
                               const std::vector<TokenId>& context, double uniform);

}  // namespace tandem
