#pragma once
// Tests against transformers: a fixture script (tests/**/*_fixture.py) run in the project's Python
// (.venv, TANDEM_PYTHON) writes references that the C++ test reads. Without that Python or without
// transformers in it, the tests skip with the reason.

#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tandem/data/tokenizer.h"
#include "tandem/serve/batch_scheduler.h"
#include "test_util.h"

namespace tandem::test {

inline std::string shell_quoted(const std::string& s) { return "'" + s + "'"; }

/// Why a transformers fixture cannot run here, or "" when it can.
inline std::string transformers_missing() {
  if (!std::filesystem::exists(TANDEM_PYTHON))
    return std::string("no Python at ") + TANDEM_PYTHON + " (scripts/setup.sh makes it)";
  const std::string probe = shell_quoted(TANDEM_PYTHON) + " -c 'import transformers, safetensors' >/dev/null 2>&1";
  if (std::system(probe.c_str()) != 0)
    return std::string("transformers is not installed in ") + TANDEM_PYTHON + " (scripts/setup.sh installs it)";
  return "";
}

/// Runs `script` (relative to the source tree) with `args`, its output in `log`; "" on success,
/// else the command and what it printed.
inline std::string run_python_fixture(const std::string& script, const std::string& args, const std::string& log) {
  const std::string cmd = shell_quoted(TANDEM_PYTHON) + " " +
                          shell_quoted(std::string(TANDEM_SOURCE_DIR) + "/" + script) + " " + args + " >" +
                          shell_quoted(log) + " 2>&1";
  return std::system(cmd.c_str()) == 0 ? "" : cmd + " failed:\n" + read_text(log);
}

/// A 1-D tensor of token ids as a vector.
inline std::vector<TokenId> ids_of(const torch::Tensor& t) {
  const auto c = t.to(torch::kInt64).contiguous();
  return std::vector<TokenId>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

/// A greedy request for `prompt` and `tokens` new tokens, each generated token appended to `out`
/// (which must outlive the request).
inline GenerationRequest greedy_request(std::vector<TokenId> prompt, int64_t tokens, std::vector<TokenId>& out) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = tokens;
  r.sampling.temperature = 0;
  r.on_event = [&out](const GenerationEvent& e) {
    if (e.token) out.push_back(*e.token);
  };
  return r;
}

}  // namespace tandem::test
