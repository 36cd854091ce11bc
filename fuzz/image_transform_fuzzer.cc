// libFuzzer harness: image decode + transform, the work every image sample goes through, for
// JPEG and PNG (the decoder tells them apart by content) with and without EXIF orientation.
// The first 4 bytes choose the transform (kind, size, flip, exif_orientation) and the seed;
// the rest is the file. Any input must decode or fail with a status: no crash, no
// out-of-bounds access, no undefined behaviour (the harness runs under ASan + UBSan).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/random.h"
#include "server/decode/image_transform.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const int out = 1 + data[0] % 64;
  ferry::ImageTransform t = (data[1] & 1) != 0
                                ? ferry::ImageTransform::ResizeCenterCrop(out, out + data[2] % 64)
                                : ferry::ImageTransform::RandomResizedCrop(out, (data[1] & 2) != 0);
  t.exif_orientation = (data[1] & 4) != 0;
  ferry::DecodeLimits limits;
  limits.max_image_pixels = 1 << 22;  // the fuzzer's memory limit, not ferryd's default
  static ferry::ImageDecoder* decoder = new ferry::ImageDecoder();
  decoder->set_limits(limits);
  ferry::Rng rng(data[3]);
  std::vector<uint8_t> row(static_cast<size_t>(out) * out * 3);
  (void)ferry::DecodeAndTransform(*decoder, absl::MakeConstSpan(data + 4, size - 4), t, rng,
                                  absl::MakeSpan(row));
  int w = 0, h = 0;
  (void)decoder->ReadSize(absl::MakeConstSpan(data + 4, size - 4), &w, &h);
  return 0;
}
