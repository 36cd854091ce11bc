// libFuzzer harness: the .npy header parser. Any input parses or fails with a status; a
// parsed layout never points past the file.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "server/dataset/npy_source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<ferry::NpyHeader> header =
      ferry::ParseNpyHeader(absl::MakeConstSpan(data, size), "fuzz.npy");
  if (header.ok() && header->data_offset > size) abort();
  return 0;
}
