#pragma once
// The embedded default corpus: generated English-like text with learnable structure (a small
// grammar of sentences, counting sequences and single-digit sums), byte-tokenised, so a model
// shows falling loss with no download.

#include <cstdint>
#include <string>

namespace tandem {

/// `bytes` characters of generated text, identical for the same seed.
std::string generate_corpus_text(int64_t bytes, uint64_t seed);

}  // namespace tandem
