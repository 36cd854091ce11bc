// The plain-bytes program of photometric.h (its kinds, one op, one sample's program), kept
// apart from that header so that photometric.cu, which nvcc compiles without abseil, reads
// the same definitions as the launcher and the workers that write programs.
#ifndef FERRY_SERVER_KERNELS_INTERNAL_PHOTOMETRIC_PROGRAM_H_
#define FERRY_SERVER_KERNELS_INTERNAL_PHOTOMETRIC_PROGRAM_H_

#include <cstdint>

namespace ferry {

enum class PhotometricKind : uint32_t {
  kBrightness = 1,
  kContrast = 2,
  kSaturation = 3,
  kHue = 4,
  kGrayscale = 5,
  kNormalize = 6,
  kErase = 7,
};

struct PhotometricOp {
  uint32_t kind = 0;  // PhotometricKind
  float a = 0;        // factor (brightness, contrast, saturation, hue)
  int32_t top = 0, left = 0, height = 0, width = 0;  // kErase
  float v[3] = {0, 0, 0};                            // kErase: value; kNormalize: mean
  float w[3] = {1, 1, 1};                            // kNormalize: std
};
static_assert(sizeof(PhotometricOp) == 48, "PhotometricOp is 48 bytes");

constexpr int kMaxPhotometricOps = 15;

// One sample's program: ops[0, num_ops) in order. Plain bytes: the workers write it into a
// hidden field of the host slot and it reaches the device with the batch's copy.
struct PhotometricProgram {
  uint32_t num_ops = 0;
  uint32_t reserved[3] = {0, 0, 0};
  PhotometricOp ops[kMaxPhotometricOps];
};
static_assert(sizeof(PhotometricProgram) == 16 + 48 * kMaxPhotometricOps,
              "PhotometricProgram is a 16-byte header and kMaxPhotometricOps ops");

}  // namespace ferry

#endif  // FERRY_SERVER_KERNELS_INTERNAL_PHOTOMETRIC_PROGRAM_H_
