// libFuzzer harness: the EXIF orientation reader (exif.h) on untrusted bytes, as a whole JPEG
// or PNG file and as a bare TIFF block, then the pixel turn it selects on a small image whose
// size the input picks. Any input gives an orientation in 1..8 and reads nothing outside the
// input (ASan + UBSan).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "server/decode/exif.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::Span<const uint8_t> bytes(data, size);
  const int from_file = ferry::ReadExifOrientation(bytes);
  const int from_tiff = ferry::ParseExifOrientation(bytes);
  if (from_file < 1 || from_file > 8 || from_tiff < 1 || from_tiff > 8) abort();
  const absl::Span<const uint8_t> in_jpeg = ferry::FindJpegExif(bytes);
  const absl::Span<const uint8_t> in_png = ferry::FindPngExif(bytes);
  for (absl::Span<const uint8_t> block : {in_jpeg, in_png}) {
    if (!block.empty() && (block.data() < data || block.data() + block.size() > data + size)) {
      abort();
    }
  }
  if (size < 2) return 0;
  const int width = 1 + data[0] % 9, height = 1 + data[1] % 7;
  std::vector<uint8_t> src(static_cast<size_t>(width) * height * 3);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i);
  int ow = 0, oh = 0;
  ferry::OrientedSize(from_tiff, width, height, &ow, &oh);
  std::vector<uint8_t> dst(static_cast<size_t>(ow) * oh * 3);
  if (dst.size() != src.size()) abort();
  ferry::ApplyExifOrientation(from_tiff, src.data(), width, height, dst.data());
  return 0;
}
