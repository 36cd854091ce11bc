// libFuzzer harness: the S3 bucket-listing parser over any bytes (a store's answer, or
// whatever a hostile endpoint sends). It must give a page or fail with a status, never read
// outside the input, and a truncated page must name the next one.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "server/remote/s3_listing.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<ferry::ListPage> page =
      ferry::ParseListObjectsV2(absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!page.ok()) return 0;
  if (page->truncated && page->next_token.empty()) abort();
  return 0;
}
