#pragma once
// JSON text from a file tandem did not write (HF configs, shard indexes, DeepSpeed configs):
// parsed, or refused in one line naming the file.

#include <nlohmann/json.hpp>

#include <string>

namespace tandem {

/// The parsed text; UserError "<origin>: not valid JSON (...)" for a syntax error or a number out of range.
nlohmann::json parse_json_text(const std::string& text, const std::string& origin);

}  // namespace tandem
