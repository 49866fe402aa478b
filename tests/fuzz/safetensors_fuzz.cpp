// libFuzzer: the safetensors reader (header length, JSON, dtypes, shapes, offsets, overlaps) and
// the tensor copies out of an accepted file.

#include "fuzz_inputs.h"
#include "tandem/formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::fuzz::MemFile f(data, size);
  tandem::fuzz::accepts([&] {
    tandem::SafetensorsFile file(f.path());
    for (const auto& name : file.names()) (void)file.tensor(name);
  });
  return 0;
}
