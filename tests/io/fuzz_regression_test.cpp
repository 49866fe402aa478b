// Replays the fuzz corpora kept in tests/data/fuzz/<parser>/ (seeds, and inputs that once broke a
// parser) through the same calls the libFuzzer targets make (tests/fuzz/*_fuzz.cpp): each input
// is accepted or refused with a UserError, never anything else.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../fuzz/fuzz_inputs.h"
#include "../test_util.h"
#include "tandem/core/config.h"
#include "tandem/formats/deepspeed.h"
#include "tandem/data/sp_model_proto.h"
#include "tandem/data/sp_char.h"
#include "tandem/data/sp_unigram.h"
#include "tandem/data/token_file.h"
#include "tandem/formats/safetensors.h"

namespace fs = std::filesystem;

namespace tandem {
namespace {

std::vector<std::string> corpus(const std::string& parser) {
  const fs::path dir = fs::path(TANDEM_SOURCE_DIR) / "tests/data/fuzz" / parser;
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

void replay(const std::string& parser, const std::function<void(const std::string& bytes, const std::string& path)>& run) {
  const auto files = corpus(parser);
  ASSERT_FALSE(files.empty()) << "no inputs under tests/data/fuzz/" << parser;
  for (const auto& f : files) {
    SCOPED_TRACE(f);
    const std::string bytes = test::read_text(f);
    fuzz::MemFile mem(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    EXPECT_NO_THROW(run(bytes, mem.path()));
  }
}

TEST(FuzzRegression, Safetensors) {
  replay("safetensors", [](const std::string&, const std::string& path) {
    fuzz::accepts([&] {
      SafetensorsFile file(path);
      for (const auto& name : file.names()) (void)file.tensor(name);
    });
  });
}

TEST(FuzzRegression, TokenFiles) {
  replay("token_file", [](const std::string&, const std::string& path) {
    for (const auto fmt : {TokenFormat::kAuto, TokenFormat::kLlmc, TokenFormat::kNanoGpt, TokenFormat::kText})
      fuzz::accepts([&] {
        const auto buf = TokenBuffer::open(path, fmt);
        if (buf.size() > 0) (void)buf.max_token();
      });
  });
}

TEST(FuzzRegression, SentencePieceModels) {
  replay("sp_model", [](const std::string& bytes, const std::string&) {
    fuzz::accepts([&] {
      auto model = parse_sp_model_proto(bytes, "fuzz.model");
      model.model_type = 1, model.treat_whitespace_as_suffix = false;
      const auto unigram = sp_unigram_for_model(model, "fuzz.model");
      model.model_type = 4;
      const auto chars = sp_char_for_model(model, "fuzz.model");
      for (const std::string& text : {std::string(), std::string("  Hello \t world  "),
                                      std::string("caf\xC3\xA9 \xF0\x9F\x98\x80 <sep> \xFF\xC3"), bytes.substr(0, 96)}) {
        (void)unigram->encode(text);
        (void)chars->encode(text);
      }
    });
  });
}

TEST(FuzzRegression, ConfigsAndDeepSpeedJson) {
  replay("config", [](const std::string& bytes, const std::string& path) {
    fuzz::accepts([&] {
      Config c;
      load_yaml_config_text(c, bytes, "fuzz.yaml");
      validate_config(c);
    });
    fuzz::accepts([&] {
      Config c;
      load_deepspeed_config(c, path);
      validate_config(c);
    });
  });
}

TEST(FuzzRegression, ANumberOverflowInJsonIsACleanRefusal) {
  // Found by fuzz.config: nlohmann's out_of_range (not a parse_error) escaped as a crash.
  test::TempDir dir;
  std::ofstream(dir.file("ds.json")) << "114e10550\"";
  Config c;
  const std::string err = test::error_of([&] { load_deepspeed_config(c, dir.file("ds.json")); });
  EXPECT_NE(err.find("not valid JSON"), std::string::npos) << err;
}

}  // namespace
}  // namespace tandem
