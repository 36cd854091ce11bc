#include "server/decode/exif.h"

#include <cstddef>
#include <cstring>

namespace ferry {
namespace {

constexpr uint8_t kJpegSignature[] = {0xFF, 0xD8, 0xFF};
constexpr uint8_t kPngSignature[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
constexpr uint8_t kExifPrefix[] = {'E', 'x', 'i', 'f', 0, 0};

bool StartsWith(absl::Span<const uint8_t> data, const uint8_t* prefix, size_t n) {
  return data.size() >= n && std::memcmp(data.data(), prefix, n) == 0;
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// PNG's CRC-32 (ISO 3309), bit by bit: it only ever covers an eXIf chunk, a few KB at most.
uint32_t Crc32(const uint8_t* data, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= data[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// Reads TIFF integers in the structure's byte order; every read is checked against its size.
class TiffReader {
 public:
  TiffReader(absl::Span<const uint8_t> data, bool big_endian)
      : data_(data), big_endian_(big_endian) {}

  bool U16(size_t offset, uint32_t* v) const {
    if (offset > data_.size() || data_.size() - offset < 2) return false;
    const uint8_t* p = data_.data() + offset;
    *v = big_endian_ ? (p[0] << 8) | p[1] : (p[1] << 8) | p[0];
    return true;
  }
  bool U32(size_t offset, uint32_t* v) const {
    if (offset > data_.size() || data_.size() - offset < 4) return false;
    const uint8_t* p = data_.data() + offset;
    *v = big_endian_
             ? BigEndian32(p)
             : (uint32_t{p[3]} << 24) | (uint32_t{p[2]} << 16) | (uint32_t{p[1]} << 8) | p[0];
    return true;
  }

 private:
  absl::Span<const uint8_t> data_;
  bool big_endian_;
};

// TIFF field types that PIL turns into an integer Orientation.
constexpr uint32_t kShort = 3, kLong = 4, kSShort = 8, kSLong = 9;
constexpr uint32_t kOrientationTag = 0x0112;
constexpr size_t kIfdEntryBytes = 12;

}  // namespace

absl::Span<const uint8_t> FindJpegExif(absl::Span<const uint8_t> jpeg) {
  if (!StartsWith(jpeg, kJpegSignature, 2)) return {};
  size_t pos = 2;
  while (pos < jpeg.size()) {
    if (jpeg[pos] != 0xFF) return {};  // Not a marker where one must be: stop looking.
    while (pos < jpeg.size() && jpeg[pos] == 0xFF) ++pos;  // Fill bytes.
    if (pos >= jpeg.size()) return {};
    const uint8_t marker = jpeg[pos++];
    // Start of scan or end of image: no metadata past here (PIL stops at SOS too).
    if (marker == 0xDA || marker == 0xD9) return {};
    // Markers without a length: TEM and RSTn.
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;
    if (jpeg.size() - pos < 2) return {};
    const size_t length = (size_t{jpeg[pos]} << 8) | jpeg[pos + 1];
    if (length < 2 || length > jpeg.size() - pos) return {};
    const absl::Span<const uint8_t> segment = jpeg.subspan(pos + 2, length - 2);
    if (marker == 0xE1 && StartsWith(segment, kExifPrefix, sizeof(kExifPrefix))) {
      return segment.subspan(sizeof(kExifPrefix));
    }
    pos += length;
  }
  return {};
}

absl::Span<const uint8_t> FindPngExif(absl::Span<const uint8_t> png) {
  if (!StartsWith(png, kPngSignature, sizeof(kPngSignature))) return {};
  absl::Span<const uint8_t> exif;
  size_t pos = sizeof(kPngSignature);
  // Each chunk: length (4, big-endian), type (4), data (length), CRC (4) of type and data.
  while (png.size() - pos >= 12) {
    const size_t length = BigEndian32(png.data() + pos);
    const uint8_t* type = png.data() + pos + 4;
    if (length > png.size() - pos - 12) break;  // Truncated: keep what was found.
    // An eXIf whose CRC does not match is dropped, as the decoder drops a damaged ancillary
    // chunk; an earlier good one stands.
    if (std::memcmp(type, "eXIf", 4) == 0 &&
        Crc32(type, 4 + length) == BigEndian32(type + 4 + length)) {
      exif = png.subspan(pos + 8, length);
    }
    if (std::memcmp(type, "IEND", 4) == 0) break;
    pos += 12 + length;
  }
  return exif;
}

int ParseExifOrientation(absl::Span<const uint8_t> tiff) {
  if (tiff.size() < 8) return 1;
  bool big_endian;
  if (tiff[0] == 'I' && tiff[1] == 'I' && tiff[2] == 42 && tiff[3] == 0) {
    big_endian = false;
  } else if (tiff[0] == 'M' && tiff[1] == 'M' && tiff[2] == 0 && tiff[3] == 42) {
    big_endian = true;
  } else {
    return 1;
  }
  const TiffReader r(tiff, big_endian);
  uint32_t ifd = 0, entries = 0;
  if (!r.U32(4, &ifd) || !r.U16(ifd, &entries)) return 1;
  int orientation = 1;
  for (uint32_t i = 0; i < entries; ++i) {
    const size_t entry = size_t{ifd} + 2 + i * kIfdEntryBytes;
    uint32_t tag = 0, type = 0, count = 0;
    // An entry cut off by the end of the block ends the directory (PIL keeps the entries
    // read before it).
    if (!r.U16(entry, &tag) || !r.U16(entry + 2, &type) || !r.U32(entry + 4, &count) ||
        tiff.size() - entry < kIfdEntryBytes) {
      break;
    }
    if (tag != kOrientationTag || count == 0) continue;
    const bool is_short = type == kShort || type == kSShort;
    if (!is_short && type != kLong && type != kSLong) {
      orientation = 1;  // PIL: a value it does not read as an integer transposes nothing.
      continue;
    }
    // The first value: in the entry when all values fit its 4 bytes, else at an offset.
    const uint64_t bytes = uint64_t{count} * (is_short ? 2 : 4);
    size_t at = entry + 8;
    if (bytes > 4) {
      uint32_t offset = 0;
      r.U32(entry + 8, &offset);  // In bounds: the entry was checked whole.
      at = offset;
    }
    uint32_t value = 0;
    // Out of bounds: PIL skips the entry ("possibly corrupt EXIF data").
    if (!(is_short ? r.U16(at, &value) : r.U32(at, &value))) continue;
    orientation = value >= 1 && value <= 8 ? static_cast<int>(value) : 1;
  }
  return orientation;
}

int ReadExifOrientation(absl::Span<const uint8_t> image) {
  if (StartsWith(image, kJpegSignature, sizeof(kJpegSignature))) {
    return ParseExifOrientation(FindJpegExif(image));
  }
  if (StartsWith(image, kPngSignature, sizeof(kPngSignature))) {
    return ParseExifOrientation(FindPngExif(image));
  }
  return 1;
}

void OrientedSize(int orientation, int width, int height, int* oriented_width,
                  int* oriented_height) {
  const bool swap = orientation >= 5 && orientation <= 8;
  *oriented_width = swap ? height : width;
  *oriented_height = swap ? width : height;
}

void ApplyExifOrientation(int orientation, const uint8_t* src, int width, int height,
                          uint8_t* dst) {
  // Output pixel (x, y) reads src[origin + x * step_x + y * step_y] (byte offsets).
  const ptrdiff_t px = 3;
  const ptrdiff_t row = ptrdiff_t{width} * 3;
  const ptrdiff_t last_x = ptrdiff_t{width - 1} * px;
  const ptrdiff_t last_y = ptrdiff_t{height - 1} * row;
  ptrdiff_t origin = 0, step_x = px, step_y = row;
  switch (orientation) {
    case 2:  // FLIP_LEFT_RIGHT
      origin = last_x, step_x = -px, step_y = row;
      break;
    case 3:  // ROTATE_180
      origin = last_y + last_x, step_x = -px, step_y = -row;
      break;
    case 4:  // FLIP_TOP_BOTTOM
      origin = last_y, step_x = px, step_y = -row;
      break;
    case 5:  // TRANSPOSE: (x, y) <- (y, x)
      origin = 0, step_x = row, step_y = px;
      break;
    case 6:  // ROTATE_270 (clockwise): (x, y) <- (y, h - 1 - x)
      origin = last_y, step_x = -row, step_y = px;
      break;
    case 7:  // TRANSVERSE: (x, y) <- (w - 1 - y, h - 1 - x)
      origin = last_y + last_x, step_x = -row, step_y = -px;
      break;
    case 8:  // ROTATE_90 (counter-clockwise): (x, y) <- (w - 1 - y, x)
      origin = last_x, step_x = row, step_y = -px;
      break;
    default:
      std::memcpy(dst, src, static_cast<size_t>(row) * height);
      return;
  }
  int out_w = 0, out_h = 0;
  OrientedSize(orientation, width, height, &out_w, &out_h);
  for (int y = 0; y < out_h; ++y) {
    const uint8_t* s = src + origin + y * step_y;
    for (int x = 0; x < out_w; ++x, s += step_x, dst += 3) {
      dst[0] = s[0];
      dst[1] = s[1];
      dst[2] = s[2];
    }
  }
}

}  // namespace ferry
