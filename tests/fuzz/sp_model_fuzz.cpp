// libFuzzer: SentencePiece model files (tokenizer.model) read from their protobuf bytes, then
// encoded as a unigram model and as a char model (whatever type the bytes name): the compiled
// normalization's trie and the segmentation over texts fixed and taken from the input (Note
// [SentencePiece unigram], Note [SentencePiece char model]).

#include <string>

#include "fuzz_inputs.h"
#include "tandem/data/sp_model_proto.h"
#include "tandem/data/sp_char.h"
#include "tandem/data/sp_unigram.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  tandem::fuzz::accepts([&] {
    auto model = tandem::parse_sp_model_proto(bytes, "fuzz.model");
    model.model_type = 1, model.treat_whitespace_as_suffix = false;
    const auto unigram = tandem::sp_unigram_for_model(model, "fuzz.model");
    model.model_type = 4;
    const auto chars = tandem::sp_char_for_model(model, "fuzz.model");
    for (const std::string& text : {std::string(), std::string("  Hello \t world  "),
                                    std::string("caf\xC3\xA9 \xF0\x9F\x98\x80 <sep> \xFF\xC3"), bytes.substr(0, 96)}) {
      (void)unigram->encode(text);
      (void)chars->encode(text);
    }
  });
  return 0;
}
