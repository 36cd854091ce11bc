// ApplyPhotometricReference: photometric.h's program on the host, op by op over the whole
// image as torchvision.transforms.v2.functional runs it on a float32 CHW tensor, with the
// same float32 operations in the same order (torchvision's own expressions are quoted).
// Kept plain and separate from the kernel's fused per-pixel form, so that the tests
// compare two independent implementations.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "server/kernels/photometric.h"

namespace ferry {
namespace {

// torch.clamp(x, 0, 1): NaN stays NaN.
float Clamp01(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }

// _rgb_to_grayscale_image: r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).
float Gray(float r, float g, float b) { return r * 0.2989f + g * 0.587f + b * 0.114f; }

// torch.remainder(x, 1.0) on floats: fmod, moved into [0, 1) when negative.
float Remainder1(float x) {
  float mod = std::fmod(x, 1.0f);
  if (mod != 0.0f && mod < 0.0f) mod += 1.0f;
  return mod;
}

// v2.functional.adjust_hue_image on one pixel: _rgb_to_hsv, h = (h + factor) % 1.0,
// _hsv_to_rgb.
void AdjustHue(float factor, float& r, float& g, float& b) {
  // _rgb_to_hsv.
  const float maxc = std::fmax(r, std::fmax(g, b));
  const float minc = std::fmin(r, std::fmin(g, b));
  const bool eqc = maxc == minc;  // gray: s = 0 and h = 0 without dividing by zero
  const float channels_range = maxc - minc;
  const float s = channels_range / (eqc ? 1.0f : maxc);
  const float divisor = eqc ? 1.0f : channels_range;
  const float rc = (maxc - r) / divisor;
  const float gc = (maxc - g) / divisor;
  const float bc = (maxc - b) / divisor;
  // hr + hg + hb, of which the masks leave one.
  float h;
  if (maxc == r) {
    h = bc - gc;
  } else if (maxc == g) {
    h = (rc + 2.0f) - bc;
  } else {
    h = (gc + 4.0f) - rc;
  }
  h = std::fmod(h * static_cast<float>(1.0 / 6.0) + 1.0f, 1.0f);
  const float v = maxc;

  h = Remainder1(h + factor);

  // _hsv_to_rgb.
  const float h6 = h * 6.0f;
  const float i = std::floor(h6);
  const float f = h6 - i;
  int sector = static_cast<int>(i) % 6;
  if (sector < 0) sector += 6;
  const float sxf = s * f;
  const float one_minus_s = 1.0f - s;
  const float q = Clamp01((1.0f - sxf) * v);
  const float t = Clamp01((sxf + one_minus_s) * v);
  const float p = Clamp01(one_minus_s * v);
  // select = [[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]] over (v, p, q, t).
  switch (sector) {
    case 0:
      r = v, g = t, b = p;
      break;
    case 1:
      r = q, g = v, b = p;
      break;
    case 2:
      r = p, g = v, b = t;
      break;
    case 3:
      r = p, g = q, b = v;
      break;
    case 4:
      r = t, g = p, b = v;
      break;
    default:
      r = v, g = p, b = q;
      break;
  }
}

}  // namespace

void ApplyPhotometricReference(const uint8_t* src_hwc, const PhotometricProgram& program,
                               int height, int width, float* dst_chw) {
  const size_t pixels = static_cast<size_t>(height) * static_cast<size_t>(width);
  float* const red = dst_chw;
  float* const green = dst_chw + pixels;
  float* const blue = dst_chw + 2 * pixels;
  // v2.ToDtype(float32, scale=True): image.to(float32).mul_(1.0 / 255).
  const float scale = static_cast<float>(1.0 / 255.0);
  for (size_t i = 0; i < pixels; ++i) {
    red[i] = static_cast<float>(src_hwc[3 * i]) * scale;
    green[i] = static_cast<float>(src_hwc[3 * i + 1]) * scale;
    blue[i] = static_cast<float>(src_hwc[3 * i + 2]) * scale;
  }
  float* const planes[3] = {red, green, blue};

  const int num_ops = program.num_ops < static_cast<uint32_t>(kMaxPhotometricOps)
                          ? static_cast<int>(program.num_ops)
                          : kMaxPhotometricOps;
  for (int k = 0; k < num_ops; ++k) {
    const PhotometricOp& op = program.ops[k];
    switch (static_cast<PhotometricKind>(op.kind)) {
      case PhotometricKind::kBrightness:
        // image.mul(factor).clamp_(0, 1)
        for (float* plane : planes) {
          for (size_t i = 0; i < pixels; ++i) plane[i] = Clamp01(plane[i] * op.a);
        }
        break;
      case PhotometricKind::kContrast: {
        // _blend(image, mean of gray over the image, factor)
        double sum = 0;
        for (size_t i = 0; i < pixels; ++i) sum += Gray(red[i], green[i], blue[i]);
        const float mean = pixels == 0 ? 0.0f : static_cast<float>(sum / pixels);
        const float other = (1.0f - op.a) * mean;
        for (float* plane : planes) {
          for (size_t i = 0; i < pixels; ++i) plane[i] = Clamp01(plane[i] * op.a + other);
        }
        break;
      }
      case PhotometricKind::kSaturation:
        // _blend(image, gray, factor)
        for (size_t i = 0; i < pixels; ++i) {
          const float gray = Gray(red[i], green[i], blue[i]);
          const float other = gray * (1.0f - op.a);
          red[i] = Clamp01(red[i] * op.a + other);
          green[i] = Clamp01(green[i] * op.a + other);
          blue[i] = Clamp01(blue[i] * op.a + other);
        }
        break;
      case PhotometricKind::kHue:
        for (size_t i = 0; i < pixels; ++i) AdjustHue(op.a, red[i], green[i], blue[i]);
        break;
      case PhotometricKind::kGrayscale:
        for (size_t i = 0; i < pixels; ++i) {
          red[i] = green[i] = blue[i] = Gray(red[i], green[i], blue[i]);
        }
        break;
      case PhotometricKind::kNormalize:
        // image.sub(mean).div_(std)
        for (int c = 0; c < 3; ++c) {
          for (size_t i = 0; i < pixels; ++i) planes[c][i] = (planes[c][i] - op.v[c]) / op.w[c];
        }
        break;
      case PhotometricKind::kErase: {
        // image[..., top:top + height, left:left + width] = v
        const int64_t y0 = op.top < 0 ? 0 : op.top;
        const int64_t x0 = op.left < 0 ? 0 : op.left;
        const int64_t y1 = std::min<int64_t>(int64_t{op.top} + op.height, height);
        const int64_t x1 = std::min<int64_t>(int64_t{op.left} + op.width, width);
        for (int c = 0; c < 3; ++c) {
          for (int64_t y = y0; y < y1; ++y) {
            for (int64_t x = x0; x < x1; ++x) planes[c][y * width + x] = op.v[c];
          }
        }
        break;
      }
      default:
        return;  // an unknown kind ends the program
    }
  }
}

}  // namespace ferry
