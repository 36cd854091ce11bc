// PNG decoding with libspng to RGB uint8 HWC, converted the way PIL's
// Image.open(f).convert("RGB") converts each PNG type (Debian 12's Pillow 9.4, checked by
// tests/integration/test_image_formats.py):
//   gray 1/2/4/8-bit     v * 255 / (2^depth - 1) in all three channels (PIL "1" and "L")
//   gray 16-bit          min(v, 255): PIL opens it as mode "I", whose convert("RGB") clips
//   gray+alpha, RGB(A)   alpha dropped, not composited; 16-bit samples by their high byte
//   palette 1/2/4/8-bit  the PLTE colour; an index past the palette's end is gray (i, i, i)
//   tRNS, gAMA, cHRM, iCCP, sRGB, sBIT  ignored
// Interlaced (Adam7) files are deinterlaced. Private to server/decode.
#ifndef FERRY_SERVER_DECODE_INTERNAL_PNG_H_
#define FERRY_SERVER_DECODE_INTERNAL_PNG_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "server/decode/image_transform.h"

namespace ferry::decode_internal {

// Width and height from the IHDR chunk. INVALID_ARGUMENT "cannot decode PNG: <libspng's
// message>" for a bad signature or IHDR.
absl::Status ReadPngSize(absl::Span<const uint8_t> png, int* width, int* height);

// Decodes all of `png` into *rgb (resized to width * height * 3 + `padding` bytes; the
// padding is left unspecified). limits.max_image_pixels is checked from the IHDR before any
// image memory is allocated. `scratch` holds the raw rows (reused across calls).
// INVALID_ARGUMENT naming the limit, or "cannot decode PNG: <libspng's message>" for a
// corrupt or truncated file, including a CRC mismatch in a critical chunk (a damaged
// ancillary chunk is dropped, as libpng does).
absl::Status DecodePngRgb(absl::Span<const uint8_t> png, const DecodeLimits& limits, size_t padding,
                          std::vector<uint8_t>* rgb, std::vector<uint8_t>* scratch, int* width,
                          int* height);

}  // namespace ferry::decode_internal

#endif  // FERRY_SERVER_DECODE_INTERNAL_PNG_H_
