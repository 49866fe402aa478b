// libFuzzer: token files in every format (llm.c header, nanoGPT raw, text), then reads across them.

#include "fuzz_inputs.h"
#include "tandem/data/token_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::fuzz::MemFile f(data, size);
  using tandem::TokenFormat;
  for (const auto fmt : {TokenFormat::kAuto, TokenFormat::kLlmc, TokenFormat::kNanoGpt, TokenFormat::kText}) {
    tandem::fuzz::accepts([&] {
      const auto buf = tandem::TokenBuffer::open(f.path(), fmt);
      if (buf.size() > 0) {
        (void)buf.at(buf.size() - 1);
        (void)buf.max_token();
        int64_t out[4];
        const int64_t n = std::min<int64_t>(4, buf.size());
        buf.read(buf.size() - n, n, out);
      }
    });
  }
  return 0;
}
