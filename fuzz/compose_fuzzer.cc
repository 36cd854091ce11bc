// libFuzzer harness: a composed transform (compose.h) of up to four ops whose kinds, sizes,
// padding, padding modes and probabilities come from the input, run on the image that
// follows them (JPEG or PNG; the fuzzer also changes the dimensions its header declares,
// as a 1 x 65,500 panorama does). Every intermediate image is bounded by the larger of
// max_image_pixels and the output's pixels before it is allocated: any input must run or
// fail with a status, within the fuzzer's memory limit (-rss_limit_mb), with no crash, no
// allocation failure and no undefined behaviour (the harness runs under ASan + UBSan).
//
// Layout: byte 0 = number of ops - 1 (low 2 bits), device program (bit 2), EXIF orientation
// (bit 3), seed (high 4 bits); then 6 bytes per op (kind, size low, size high, padding,
// flags, probability); then the image file.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "server/decode/compose.h"
#include "server/kernels/photometric.h"

namespace {

constexpr size_t kOpBytes = 6;
constexpr int kMaxSize = 4096;             // a side of Resize, a crop, RandomCrop
constexpr size_t kMaxRowBytes = 16 << 20;  // the output row the harness allocates

ferry::ComposeStep Step(const uint8_t* b) {
  using Kind = ferry::ComposeStep::Kind;
  static constexpr Kind kKinds[] = {
      Kind::kRandomResizedCrop,  Kind::kResize,       Kind::kCenterCrop,    Kind::kRandomCrop,
      Kind::kHorizontalFlip,     Kind::kVerticalFlip, Kind::kColorJitter,   Kind::kRandomGrayscale,
      Kind::kTrivialAugmentWide, Kind::kNormalize,    Kind::kRandomErasing,
  };
  ferry::ComposeStep s;
  s.kind = kKinds[b[0] % (sizeof(kKinds) / sizeof(kKinds[0]))];
  s.size = 1 + (b[1] | (b[2] << 8)) % kMaxSize;
  const int pad = (b[3] & 0x7f) << (b[3] >> 7 ? 5 : 0);  // up to 4,064
  s.padding[0] = (b[4] & 1) ? pad : 0;
  s.padding[1] = (b[4] & 2) ? pad : 0;
  s.padding[2] = (b[4] & 4) ? pad : 0;
  s.padding[3] = (b[4] & 8) ? pad : 0;
  s.pad_if_needed = (b[4] & 16) != 0;
  s.padding_mode = static_cast<ferry::PaddingMode>((b[4] >> 5) & 3);
  s.full_decode = (b[4] & 128) != 0;
  s.p = static_cast<float>(b[5] % 101) / 100.0f;
  s.jitter.has_brightness = true;
  s.jitter.brightness[0] = 0.6f;
  s.jitter.brightness[1] = 1.4f;
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t ops = 1 + (data[0] & 3);
  if (size < 1 + ops * kOpBytes) return 0;
  std::vector<ferry::ComposeStep> steps;
  for (size_t i = 0; i < ops; ++i) steps.push_back(Step(data + 1 + i * kOpBytes));
  ferry::ComposedTransform::Target target;
  target.device_program = (data[0] & 4) != 0;
  target.exif_orientation = (data[0] & 8) != 0;
  auto transform = ferry::ComposedTransform::Create(steps, target);
  if (!transform.ok() || transform->image_row_bytes() > kMaxRowBytes) return 0;

  ferry::DecodeLimits limits;
  limits.max_image_pixels = 1 << 22;  // the fuzzer's memory limit, not ferryd's default
  static ferry::ImageDecoder* decoder = new ferry::ImageDecoder();
  decoder->set_limits(limits);
  static ferry::ComposeScratch* scratch = new ferry::ComposeScratch();
  std::vector<uint8_t> image(transform->image_row_bytes());
  std::vector<uint8_t> program(transform->emits_program() ? sizeof(ferry::PhotometricProgram) : 0);
  const size_t header = 1 + ops * kOpBytes;
  (void)transform->Run(*decoder, absl::MakeConstSpan(data + header, size - header),
                       /*sample_seed=*/data[0] >> 4, *scratch, absl::MakeSpan(image),
                       absl::MakeSpan(program));
  return 0;
}
