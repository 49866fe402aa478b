#include "tandem/formats/json_text.h"

#include "tandem/core/error.h"

namespace tandem {

nlohmann::json parse_json_text(const std::string& text, const std::string& origin) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse errors, and numbers out of range
    TANDEM_FAIL(origin, ": not valid JSON (", e.what(), ")");
  }
}

}  // namespace tandem
