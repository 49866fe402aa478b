// libFuzzer: tandem's YAML config and DeepSpeed JSON readers, then validation.

#include "fuzz_inputs.h"
#include "tandem/core/config.h"
#include "tandem/formats/deepspeed.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  tandem::fuzz::accepts([&] {
    tandem::Config c;
    tandem::load_yaml_config_text(c, text, "fuzz.yaml");
    tandem::validate_config(c);
  });
  tandem::fuzz::MemFile f(data, size);
  tandem::fuzz::accepts([&] {
    tandem::Config c;
    tandem::load_deepspeed_config(c, f.path());
    tandem::validate_config(c);
  });
  return 0;
}
