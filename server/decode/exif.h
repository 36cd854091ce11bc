// EXIF orientation: finds the EXIF block of a JPEG (APP1 "Exif\0\0") or PNG (eXIf chunk),
// reads the Orientation tag (0x0112) of its first IFD, and turns an RGB image upright the
// way PIL's ImageOps.exif_transpose does.
//
// Everything here reads untrusted bytes: every read is bounds-checked, and a block that is
// absent, truncated or malformed means orientation 1 (as stored), never an error, so a
// damaged EXIF block never costs the sample its pixels.
//
//   const int o = ReadExifOrientation(file_bytes);  // 1..8
//   int w2, h2;
//   OrientedSize(o, w, h, &w2, &h2);
//   std::vector<uint8_t> upright(static_cast<size_t>(w2) * h2 * 3);
//   ApplyExifOrientation(o, rgb.data(), w, h, upright.data());
#ifndef FERRY_SERVER_DECODE_EXIF_H_
#define FERRY_SERVER_DECODE_EXIF_H_

#include <cstdint>

#include "absl/types/span.h"

namespace ferry {

// The TIFF structure (from its "II*\0" / "MM\0*" header) of the first APP1 segment that
// starts with "Exif\0\0" before the JPEG's first scan, as PIL takes it; empty when there is
// none or the marker structure is broken before one is found.
absl::Span<const uint8_t> FindJpegExif(absl::Span<const uint8_t> jpeg);

// The data of the PNG's last eXIf chunk whose CRC matches (PIL keeps the last one), before
// or after the image data, up to IEND; empty when there is none. A damaged chunk is skipped,
// as libspng drops a damaged ancillary chunk (PIL refuses the whole file).
absl::Span<const uint8_t> FindPngExif(absl::Span<const uint8_t> png);

// The Orientation (tag 0x0112) of IFD0 in a TIFF structure, little- or big-endian: a SHORT
// or SSHORT (the first value), or a LONG or SLONG of count 1, as PIL reads it; when the tag
// appears twice the last one counts (PIL's). 1 when the header or IFD is malformed or out
// of bounds, the tag is absent or of another type, or its value is not in 1..8.
int ParseExifOrientation(absl::Span<const uint8_t> tiff);

// Orientation of a JPEG or PNG file (by its signature; 1 for anything else).
int ReadExifOrientation(absl::Span<const uint8_t> image);

// Size of a width x height image after ApplyExifOrientation: 5..8 swap the sides.
void OrientedSize(int orientation, int width, int height, int* oriented_width,
                  int* oriented_height);

// Writes the upright version of `src` (RGB HWC, width x height, tightly packed) to `dst`
// (OrientedSize, tightly packed; must not overlap `src`). 2: mirror, 3: rotate 180, 4: flip
// vertically, 5: transpose, 6: rotate 90 clockwise, 7: transverse, 8: rotate 90
// counter-clockwise, i.e. PIL's FLIP_LEFT_RIGHT, ROTATE_180, FLIP_TOP_BOTTOM, TRANSPOSE,
// ROTATE_270, TRANSVERSE, ROTATE_90. Any other value copies.
void ApplyExifOrientation(int orientation, const uint8_t* src, int width, int height, uint8_t* dst);

}  // namespace ferry

#endif  // FERRY_SERVER_DECODE_EXIF_H_
