#pragma once
// Running one subcommand in-process, as `tandem <argv>` would, for the command tests: what it
// printed on stdout and stderr, what it returned and the UserError it threw; and a small byte-level
// BPE tokenizer.json the tokenizing commands read.

#include <gtest/gtest.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "../error_of.h"

namespace tandem::test {

/// What a subcommand did.
struct CommandRun {
  int code = -1;
  std::string out, err, error;  ///< stdout, stderr, the UserError's message ("" when none)
};

/// Parses `argv` (the subcommand's name first) into a fresh `Command` and runs it.
template <class Command>
CommandRun run_command(const std::vector<std::string>& argv) {
  CLI::App app{"command test"};
  Command command(app);
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());  // CLI11 takes them last first
  app.parse(reversed);
  EXPECT_TRUE(command.chosen());
  CommandRun r;
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  r.error = error_of([&] { r.code = command.run(); });
  r.err = testing::internal::GetCapturedStderr();
  r.out = testing::internal::GetCapturedStdout();
  return r;
}

/// A byte-level BPE tokenizer.json whose vocabulary is the 94 printable ASCII bytes, the space and
/// the line break (ids 0..95), then `specials` as special added tokens (96, 97, ...): every text of
/// those characters encodes byte by byte and decodes back as it was.
inline std::string ascii_tokenizer_json(const std::vector<std::string>& specials) {
  nlohmann::json vocab = nlohmann::json::object();
  int id = 0;
  for (char c = '!'; c <= '~'; ++c) vocab[std::string(1, c)] = id++;
  vocab["\xC4\xA0"] = id++;  // 'Ġ', the space
  vocab["\xC4\x8A"] = id++;  // 'Ċ', the line break
  nlohmann::json added = nlohmann::json::array();
  for (const auto& s : specials)
    added.push_back({{"id", id++}, {"content", s}, {"special", true}, {"normalized", false}});
  return nlohmann::json{{"version", "1.0"},
                        {"added_tokens", added},
                        {"normalizer", nullptr},
                        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                        {"post_processor", nullptr},
                        {"decoder", {{"type", "ByteLevel"}}},
                        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}}
      .dump();
}

}  // namespace tandem::test
