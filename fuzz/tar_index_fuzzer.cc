// libFuzzer harness: the tar indexer over any bytes (a WebDataset shard as a hostile user
// may write it). It must index or fail with a status, never read outside the input, and
// every member it reports must lie inside the archive.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "server/dataset/tar_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<ferry::TarIndex> index =
      ferry::IndexTarBytes("fuzz.tar", absl::MakeConstSpan(data, size));
  if (!index.ok()) return 0;
  for (const ferry::TarMember& m : index->members) {
    if (m.data_offset > size || m.size > size - m.data_offset) abort();  // past the end
  }
  return 0;
}
