#include "tandem/data/dataset.h"

#include "tandem/core/error.h"
#include "tandem/core/strings.h"
#include "tandem/data/synthetic.h"

namespace tandem {

DataSplits open_data(const DataConfig& cfg) {
  DataSplits s;
  TokenBuffer all;
  if (cfg.kind() == DataKind::kSynthetic) {
    // The corpus does not depend on the run's seed, so every run sees the same text.
    all = TokenBuffer::from_tokens(
        byte_tokenize(generate_corpus_text(cfg.synthetic_bytes, 20240520)),
        "synthetic corpus (byte-level), " + format_count(double(cfg.synthetic_bytes)) + " tokens");
  } else {
    all = TokenBuffer::open(cfg.path, cfg.format);
  }
  if (!cfg.val_path.empty()) {
    s.train = all;
    s.val = TokenBuffer::open(cfg.val_path, cfg.format);
  } else {
    const int64_t n_val = static_cast<int64_t>(double(all.size()) * cfg.val_fraction);
    s.train = all.slice(0, all.size() - n_val);
    s.val = all.slice(all.size() - n_val, all.size());
  }
  s.description = all.description();
  return s;
}

}  // namespace tandem
