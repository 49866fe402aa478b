#include "tandem/serve/text_stream.h"

#include <algorithm>

namespace tandem {

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stops)
    : tokenizer_(tokenizer), stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
  for (const auto& t : tokenizer_.special_tokens()) special_.insert(t.id);
}

std::string TextStream::push(TokenId token) {
  if (stopped_ || special_.count(token) > 0) return "";  // control tokens are not text (HF's skip_special_tokens)
  pending_ += tokenizer_.token_bytes(token, TokenPlace::kFollowing);
  // The earliest stop string in the pending text ends the stream.
  size_t cut = std::string::npos;
  for (const auto& s : stops_) cut = std::min(cut, pending_.find(s));
  if (cut != std::string::npos) {
    std::string out = utf8_lossy(std::string_view(pending_).substr(0, cut));
    stopped_ = true;
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that may begin a stop string, and a character cut in the middle.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n)
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  const size_t ready = utf8_complete_length(std::string_view(pending_).substr(0, pending_.size() - hold));
  std::string out = utf8_lossy(std::string_view(pending_).substr(0, ready));  // a stray byte as U+FFFD
  pending_.erase(0, ready);
  return out;
}

std::string TextStream::flush() {
  if (stopped_) return "";
  std::string rest = utf8_lossy(pending_);
  pending_.clear();
  return rest;
}

}  // namespace tandem
