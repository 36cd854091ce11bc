// libFuzzer harness: ferry's JPEG marker parser and the GPU-or-CPU decision
// (server/decode/jpeg_header.h) on untrusted bytes. Any input either fails to parse (and is
// then kCorrupt) or gives a header within the limits the parser promises; nothing outside the
// input is read (ASan + UBSan).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "server/decode/jpeg_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::Span<const uint8_t> bytes(data, size);
  const absl::StatusOr<ferry::JpegHeader> header = ferry::ParseJpegHeader(bytes);
  const ferry::GpuJpegVerdict verdict = ferry::ClassifyForGpuDecode(bytes, {});
  if (!header.ok()) {
    if (verdict.reason != ferry::GpuJpegReject::kCorrupt || verdict.width != 0) abort();
    return 0;
  }
  const ferry::JpegHeader& h = *header;
  if (h.width < 1 || h.height < 1 || h.num_components < 1) abort();
  if (h.first_scan_components < 1 || h.first_scan_components > 4) abort();
  for (int i = 0; i < h.num_components && i < ferry::JpegHeader::kMaxStoredComponents; ++i) {
    const ferry::JpegComponent& c = h.components[i];
    if (c.h < 1 || c.h > 4 || c.v < 1 || c.v > 4) abort();
  }
  if (verdict.width != h.width || verdict.height != h.height) abort();
  if (verdict.reason == ferry::GpuJpegReject::kDecoderRefused) abort();
  if (verdict.reason == ferry::GpuJpegReject::kNone &&
      (!h.has_eoi || h.precision != 8 || (h.num_components != 1 && h.num_components != 3))) {
    abort();
  }
  return 0;
}
