// Image ops with torchvision.transforms.v2's meaning on uint8 tensors. Where torchvision
// computes in float32, so does this file, operation by operation, so that the uint8 results
// agree exactly: torch rounds each float32 operation once, and where it uses a fused
// multiply-add (Tensor.add_(other, alpha=...) on CPU is vec::fmadd) this file computes the
// same value (FusedMulAdd). Compiled with -O3 and no -ffast-math, which keeps float32
// rounding as written.
#include "server/decode/image_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "server/decode/image_transform.h"

namespace ferry {
namespace {

constexpr int kNumAugmentOps = 14;

// fmaf(a, b, c) for the operands this file passes: b is a float32 constant or factor and a
// a float32 whose product with b is exact in double (24 + 24 bits), and the sum with c fits
// double's 53 bits for values in [0, 256) and the factors torchvision takes, so the only
// rounding is the final one to float, as in a fused multiply-add. Written this way because
// x86-64 without -mfma would otherwise call libm's software fma per pixel.
inline float FusedMulAdd(float a, float b, float c) {
  return static_cast<float>(static_cast<double>(a) * static_cast<double>(b) +
                            static_cast<double>(c));
}

// torch's clamp_(0, 255) then .to(torch.uint8): truncation toward zero. NaN cannot occur
// (every input is finite).
inline uint8_t ClampToU8(float v) {
  v = std::min(std::max(v, 0.0f), 255.0f);
  return static_cast<uint8_t>(v);
}

// v2's grayscale without rounding to uint8 (_rgb_to_grayscale_image(preserve_dtype=False)):
// r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114), in float32.
inline float GrayF(const uint8_t* p) {
  float l = static_cast<float>(p[0]) * 0.2989f;
  l = FusedMulAdd(static_cast<float>(p[1]), 0.587f, l);
  return FusedMulAdd(static_cast<float>(p[2]), 0.114f, l);
}

// v2 _blend(image1, image2, ratio) for uint8 image1 and a float32 image2 value:
// image1.mul(ratio).add_(image2, alpha=1 - ratio).clamp_(0, 255).to(uint8). torch rounds the
// Python floats ratio and 1 - ratio (computed in double) to float32 separately.
struct BlendFactors {
  explicit BlendFactors(double ratio)
      : ratio(static_cast<float>(ratio)), one_minus(static_cast<float>(1.0 - ratio)) {}
  float ratio, one_minus;
};
inline uint8_t Blend(uint8_t x, float other, const BlendFactors& f) {
  return ClampToU8(FusedMulAdd(other, f.one_minus, static_cast<float>(x) * f.ratio));
}

// torch.linspace(start, end, steps) in float32 as torch 2.x's CPU kernel computes element
// `i`: the first half counts up from `start`, the second half down from `end`, and the
// compiler fuses each multiply-add (checked against torch 2.11's tables in
// testing/data/torchvision_ops).
float LinspaceF(float start, float end, int steps, int i) {
  if (steps == 1) return start;
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int halfway = steps / 2;
  if (i < halfway) return FusedMulAdd(step, static_cast<float>(i), start);
  return FusedMulAdd(-step, static_cast<float>(steps - i - 1), end);
}

bool IsSigned(AugmentOp op) {
  switch (op) {
    case AugmentOp::kShearX:
    case AugmentOp::kShearY:
    case AugmentOp::kTranslateX:
    case AugmentOp::kTranslateY:
    case AugmentOp::kRotate:
    case AugmentOp::kBrightness:
    case AugmentOp::kColor:
    case AugmentOp::kContrast:
    case AugmentOp::kSharpness:
      return true;
    default:
      return false;
  }
}

bool HasMagnitude(AugmentOp op) {
  return op != AugmentOp::kIdentity && op != AugmentOp::kAutoContrast && op != AugmentOp::kEqualize;
}

// Nearest-neighbour resampling through torchvision's tensor path (_affine_grid, then
// grid_sample(mode="nearest", padding_mode="zeros", align_corners=False)) of the inverse
// affine matrix `m` (output pixel -> input pixel, both relative to the image centre), in
// float32 as torch computes it. Pixels that map outside the image get `fill`.
void AffineNearest(const RgbImage& image, const double m[6], const std::array<uint8_t, 3>& fill,
                   RgbImage* out) {
  const int w = image.width, h = image.height;
  out->Resize(w, h);
  // theta (float32), divided by [0.5 w, 0.5 h] per output coordinate, as rescaled_theta.
  const float half_w = 0.5f * static_cast<float>(w), half_h = 0.5f * static_cast<float>(h);
  const float ax = static_cast<float>(m[0]) / half_w, bx = static_cast<float>(m[1]) / half_w,
              cx = static_cast<float>(m[2]) / half_w;
  const float ay = static_cast<float>(m[3]) / half_h, by = static_cast<float>(m[4]) / half_h,
              cy = static_cast<float>(m[5]) / half_h;
  // grid_sample's unnormalisation for align_corners=False: (g + 1) * size / 2 - 0.5.
  const float scale_x = static_cast<float>(w) / 2, scale_y = static_cast<float>(h) / 2;
  for (int j = 0; j < h; ++j) {
    // The base grid: torch.linspace((1 - oh) / 2, (oh - 1) / 2, oh), exact half-integers.
    const float yg = (1.0f - static_cast<float>(h)) * 0.5f + static_cast<float>(j);
    uint8_t* dst = out->row(j);
    for (int i = 0; i < w; ++i, dst += 3) {
      const float xg = (1.0f - static_cast<float>(w)) * 0.5f + static_cast<float>(i);
      const float gx = xg * ax + yg * bx + cx;
      const float gy = xg * ay + yg * by + cy;
      const float fx = std::nearbyint((gx + 1.0f) * scale_x - 0.5f);
      const float fy = std::nearbyint((gy + 1.0f) * scale_y - 0.5f);
      if (fx >= 0 && fx < static_cast<float>(w) && fy >= 0 && fy < static_cast<float>(h)) {
        const uint8_t* src = image.row(static_cast<int>(fy)) + static_cast<int>(fx) * 3;
        dst[0] = src[0];
        dst[1] = src[1];
        dst[2] = src[2];
      } else {
        dst[0] = fill[0];
        dst[1] = fill[1];
        dst[2] = fill[2];
      }
    }
  }
}

// torchvision's _get_inverse_affine_matrix(center, angle, translate, scale=1, shear), in
// double as Python computes it. center is relative to the image centre.
void InverseAffineMatrix(double center_x, double center_y, double angle_deg, double tx, double ty,
                         double shear_x_deg, double shear_y_deg, double m[6]) {
  const double rot = angle_deg * M_PI / 180.0;
  const double sx = shear_x_deg * M_PI / 180.0;
  const double sy = shear_y_deg * M_PI / 180.0;
  const double cos_sy = std::cos(sy);
  const double tan_sx = std::tan(sx);
  const double rot_minus_sy = rot - sy;
  const double cx_plus_tx = center_x + tx;
  const double cy_plus_ty = center_y + ty;
  const double a = std::cos(rot_minus_sy) / cos_sy;
  const double b = -(a * tan_sx + std::sin(rot));
  const double c = std::sin(rot_minus_sy) / cos_sy;
  const double d = std::cos(rot) - c * tan_sx;
  m[0] = d;
  m[1] = -b;
  m[2] = 0.0;
  m[3] = -c;
  m[4] = a;
  m[5] = 0.0;
  m[2] += center_x - m[0] * cx_plus_tx - m[1] * cy_plus_ty;
  m[5] += center_y - m[3] * cx_plus_tx - m[4] * cy_plus_ty;
}

// Python's math.radians(math.degrees(x)) round trip is part of torchvision's shear; keep it.
double Degrees(double radians) { return radians * (180.0 / M_PI); }

// v2.functional.adjust_sharpness on uint8 (factor >= 0): the interior is blended with the
// 3x3 blur [[1,1,1],[1,5,1],[1,1,1]]/13 rounded to integers; the border rows and columns are
// kept. The blur's sum over 13 never lies halfway between integers, so its rounding is exact
// in integers whatever order torch's conv2d sums in.
void AdjustSharpness(RgbImage& image, double factor, RgbImage* scratch) {
  const int w = image.width, h = image.height;
  if (w <= 2 || h <= 2) return;
  *scratch = image;  // the blur reads the original pixels
  const float one_minus = static_cast<float>(1.0 - factor);
  const size_t stride = static_cast<size_t>(w) * 3;
  for (int y = 1; y < h - 1; ++y) {
    const uint8_t* above = scratch->row(y - 1);
    const uint8_t* here = scratch->row(y);
    const uint8_t* below = above + 2 * stride;
    uint8_t* dst = image.row(y);
    for (int k = 3; k < (w - 1) * 3; ++k) {
      const int sum = above[k - 3] + above[k] + above[k + 3] + here[k - 3] + 5 * here[k] +
                      here[k + 3] + below[k - 3] + below[k] + below[k + 3];
      const int blurred = (2 * sum + 13) / 26;  // round(sum / 13); never a tie
      const float x = static_cast<float>(here[k]);
      // view.add_(blurred.sub_(view), alpha=1 - factor)
      dst[k] = ClampToU8(FusedMulAdd(static_cast<float>(blurred) - x, one_minus, x));
    }
  }
}

// v2.functional.posterize(image, bits) on uint8: keep the top `bits` bits.
void Posterize(RgbImage& image, int bits) {
  if (bits >= 8) return;
  const uint8_t mask = static_cast<uint8_t>((0xFF << (8 - std::max(bits, 0))) & 0xFF);
  for (uint8_t& v : image.pixels) v &= mask;
}

// v2.functional.solarize(image, threshold) on uint8: invert where image >= threshold. The
// comparison of a uint8 tensor with a Python float promotes both to float32.
void Solarize(RgbImage& image, double threshold) {
  const float t = static_cast<float>(threshold);
  for (uint8_t& v : image.pixels) {
    if (static_cast<float>(v) >= t) v = static_cast<uint8_t>(255 - v);
  }
}

// v2.functional.autocontrast on uint8: per channel, (x - min) / ((max - min) / 255) in
// float32, truncated; a constant channel is left as is.
void AutoContrast(RgbImage& image) {
  if (image.pixels.empty()) return;
  uint8_t lo[3] = {255, 255, 255}, hi[3] = {0, 0, 0};
  for (size_t i = 0; i < image.pixels.size(); i += 3) {
    for (int c = 0; c < 3; ++c) {
      lo[c] = std::min(lo[c], image.pixels[i + c]);
      hi[c] = std::max(hi[c], image.pixels[i + c]);
    }
  }
  uint8_t lut[3][256];
  for (int c = 0; c < 3; ++c) {
    float minimum = lo[c];
    float inv_scale = (static_cast<float>(hi[c]) - minimum) * static_cast<float>(1.0 / 255.0);
    if (hi[c] == lo[c]) {
      minimum = 0.0f;
      inv_scale = 1.0f;
    }
    for (int v = 0; v < 256; ++v)
      lut[c][v] = ClampToU8((static_cast<float>(v) - minimum) / inv_scale);
  }
  for (size_t i = 0; i < image.pixels.size(); i += 3) {
    for (int c = 0; c < 3; ++c) image.pixels[i + c] = lut[c][image.pixels[i + c]];
  }
}

// v2.functional.equalize on uint8, per channel: PIL's LUT scheme in integers. step =
// (pixels not in the highest occupied bin) // 255; a channel with step 0 is left as is;
// otherwise lut[0] = 0 and lut[k] = min(255, (cdf[k - 1] + step // 2) // step).
void Equalize(RgbImage& image) {
  const size_t n = image.pixels.size() / 3;
  if (n == 0) return;
  uint8_t lut[3][256];
  bool valid[3];
  for (int c = 0; c < 3; ++c) {
    int64_t hist[256] = {};
    for (size_t i = 0; i < n; ++i) ++hist[image.pixels[i * 3 + c]];
    int last = 255;
    while (hist[last] == 0) --last;  // n > 0, so some bin is occupied
    const int64_t step = (static_cast<int64_t>(n) - hist[last]) / 255;
    valid[c] = step != 0;
    if (!valid[c]) continue;
    int64_t cdf = 0;
    lut[c][0] = 0;
    for (int k = 1; k < 256; ++k) {
      cdf += hist[k - 1];
      lut[c][k] = static_cast<uint8_t>(std::min<int64_t>(255, (cdf + step / 2) / step));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    for (int c = 0; c < 3; ++c) {
      if (valid[c]) image.pixels[i * 3 + c] = lut[c][image.pixels[i * 3 + c]];
    }
  }
}

// The factor is a double: TrivialAugmentWide passes 1 + magnitude, a Python float.
void ContrastImpl(RgbImage& image, double factor) {
  const size_t n = image.pixels.size() / 3;
  if (n == 0) return;
  // The floored grayscale values are integers, so their float32 sum is exact in any order
  // below 2^24 / 255 pixels; torch.mean divides the sum by the count in float32.
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += std::floor(GrayF(&image.pixels[i * 3]));
  const float mean = static_cast<float>(sum) / static_cast<float>(n);
  const BlendFactors f(factor);
  for (uint8_t& v : image.pixels) v = Blend(v, mean, f);
}

void SaturationImpl(RgbImage& image, double factor) {
  const BlendFactors f(factor);
  for (size_t i = 0; i < image.pixels.size(); i += 3) {
    uint8_t* p = &image.pixels[i];
    const float gray = std::floor(GrayF(p));
    p[0] = Blend(p[0], gray, f);
    p[1] = Blend(p[1], gray, f);
    p[2] = Blend(p[2], gray, f);
  }
}

// Maps coordinate i in [-before, n + after) of a padded axis onto [0, n).
int PadIndex(int i, int n, PaddingMode mode) {
  if (i >= 0 && i < n) return i;
  switch (mode) {
    case PaddingMode::kEdge:
      return std::clamp(i, 0, n - 1);
    case PaddingMode::kReflect: {
      if (n == 1) return 0;
      const int period = 2 * (n - 1);
      int r = i % period;
      if (r < 0) r += period;
      return r < n ? r : period - r;
    }
    case PaddingMode::kSymmetric: {
      const int period = 2 * n;
      int r = i % period;
      if (r < 0) r += period;
      return r < n ? r : period - 1 - r;
    }
    case PaddingMode::kConstant:
      break;
  }
  return -1;
}

}  // namespace

// ---- Geometry ------------------------------------------------------------------------

void HorizontalFlip(RgbImage& image) {
  for (int y = 0; y < image.height; ++y) {
    uint8_t* row = image.row(y);
    for (int l = 0, r = image.width - 1; l < r; ++l, --r) {
      std::swap(row[l * 3], row[r * 3]);
      std::swap(row[l * 3 + 1], row[r * 3 + 1]);
      std::swap(row[l * 3 + 2], row[r * 3 + 2]);
    }
  }
}

void VerticalFlip(RgbImage& image) {
  const size_t stride = static_cast<size_t>(image.width) * 3;
  for (int t = 0, b = image.height - 1; t < b; ++t, --b) {
    std::swap_ranges(image.row(t), image.row(t) + stride, image.row(b));
  }
}

void Pad(const RgbImage& image, int left, int top, int right, int bottom, PaddingMode mode,
         const std::array<uint8_t, 3>& fill, RgbImage* out) {
  const int w = image.width, h = image.height;
  out->Resize(w + left + right, h + top + bottom);
  std::vector<int> xs(static_cast<size_t>(out->width));
  for (int x = 0; x < out->width; ++x) xs[x] = PadIndex(x - left, w, mode);
  for (int y = 0; y < out->height; ++y) {
    const int sy = PadIndex(y - top, h, mode);
    uint8_t* dst = out->row(y);
    for (int x = 0; x < out->width; ++x, dst += 3) {
      if (sy < 0 || xs[x] < 0) {
        dst[0] = fill[0];
        dst[1] = fill[1];
        dst[2] = fill[2];
      } else {
        std::memcpy(dst, image.row(sy) + xs[x] * 3, 3);
      }
    }
  }
}

void Crop(const RgbImage& image, int top, int left, int height, int width, RgbImage* out) {
  out->Resize(width, height);
  for (int y = 0; y < height; ++y) {
    std::memcpy(out->row(y), image.row(top + y) + static_cast<size_t>(left) * 3,
                static_cast<size_t>(width) * 3);
  }
}

void ResizeBilinear(const RgbImage& image, int height, int width, RgbImage* out) {
  if (height == image.height && width == image.width) {  // v2.resize returns the input
    *out = image;
    return;
  }
  out->Resize(width, height);
  ResizeBilinearAntialias(image.pixels.data(), image.width, image.height, image.width * 3,
                          CropBox{0, 0, image.width, image.height}, out->pixels.data(), width,
                          height);
}

// ---- Colour --------------------------------------------------------------------------

void AdjustBrightness(RgbImage& image, float factor) {
  for (uint8_t& v : image.pixels) v = ClampToU8(static_cast<float>(v) * factor);
}

void AdjustContrast(RgbImage& image, float factor) { ContrastImpl(image, factor); }

void AdjustSaturation(RgbImage& image, float factor) { SaturationImpl(image, factor); }

void AdjustHue(RgbImage& image, float hue_factor) {
  const float to_unit = static_cast<float>(1.0 / 255.0);
  const float sixth = static_cast<float>(1.0 / 6.0);
  const float to_u8 = 255.999f;  // to_dtype's float -> uint8: mul(255 + 1 - 1e-3), truncate
  for (size_t i = 0; i < image.pixels.size(); i += 3) {
    uint8_t* px = &image.pixels[i];
    const float r = static_cast<float>(px[0]) * to_unit;
    const float g = static_cast<float>(px[1]) * to_unit;
    const float b = static_cast<float>(px[2]) * to_unit;
    // _rgb_to_hsv
    const float maxc = std::max(std::max(r, g), b);
    const float minc = std::min(std::min(r, g), b);
    const bool eqc = maxc == minc;
    const float range = maxc - minc;
    const float s = range / (eqc ? 1.0f : maxc);
    const float divisor = eqc ? 1.0f : range;
    const float rc = (maxc - r) / divisor;
    const float gc = (maxc - g) / divisor;
    const float bc = (maxc - b) / divisor;
    float hue;
    if (maxc == r) {
      hue = bc - gc;
    } else if (maxc == g) {
      hue = (rc + 2.0f) - bc;
    } else {
      hue = (gc + 4.0f) - rc;
    }
    hue = std::fmod(hue * sixth + 1.0f, 1.0f);
    // h.add_(hue_factor).remainder_(1.0)
    hue = std::fmod(hue + hue_factor, 1.0f);
    if (hue < 0) hue += 1.0f;
    // _hsv_to_rgb
    const float v = maxc;
    const float h6 = hue * 6.0f;
    const float fi = std::floor(h6);
    const float f = h6 - fi;
    int sector = static_cast<int>(fi) % 6;
    if (sector < 0) sector += 6;
    const float sxf = s * f;
    const float one_minus_s = 1.0f - s;
    const float q = std::clamp((1.0f - sxf) * v, 0.0f, 1.0f);
    const float t = std::clamp((sxf + one_minus_s) * v, 0.0f, 1.0f);
    const float p = std::clamp(one_minus_s * v, 0.0f, 1.0f);
    float out[3];
    switch (sector) {
      case 0:
        out[0] = v, out[1] = t, out[2] = p;
        break;
      case 1:
        out[0] = q, out[1] = v, out[2] = p;
        break;
      case 2:
        out[0] = p, out[1] = v, out[2] = t;
        break;
      case 3:
        out[0] = p, out[1] = q, out[2] = v;
        break;
      case 4:
        out[0] = t, out[1] = p, out[2] = v;
        break;
      default:
        out[0] = v, out[1] = p, out[2] = q;
        break;
    }
    for (int c = 0; c < 3; ++c) px[c] = static_cast<uint8_t>(out[c] * to_u8);
  }
}

void RgbToGrayscale(RgbImage& image) {
  for (size_t i = 0; i < image.pixels.size(); i += 3) {
    uint8_t* p = &image.pixels[i];
    const uint8_t l = static_cast<uint8_t>(GrayF(p));
    p[0] = p[1] = p[2] = l;
  }
}

ColorJitterParams SampleColorJitter(const ColorJitterOptions& options, Rng& rng) {
  ColorJitterParams params;
  // torch.randperm(4): a uniform permutation (Fisher-Yates).
  for (int i = 3; i > 0; --i) {
    const int j = static_cast<int>(rng.Below(static_cast<uint64_t>(i) + 1));
    std::swap(params.order[i], params.order[j]);
  }
  const bool has[4] = {options.has_brightness, options.has_contrast, options.has_saturation,
                       options.has_hue};
  const float* range[4] = {options.brightness, options.contrast, options.saturation, options.hue};
  for (int op = 0; op < 4; ++op) {
    params.apply[op] = has[op];
    if (has[op]) params.factor[op] = static_cast<float>(rng.Uniform(range[op][0], range[op][1]));
  }
  return params;
}

void ApplyColorJitter(const ColorJitterParams& params, RgbImage& image) {
  for (int op : params.order) {
    if (op < 0 || op > 3 || !params.apply[op]) continue;
    const float f = params.factor[op];
    switch (op) {
      case 0:
        AdjustBrightness(image, f);
        break;
      case 1:
        AdjustContrast(image, f);
        break;
      case 2:
        AdjustSaturation(image, f);
        break;
      default:
        AdjustHue(image, f);
        break;
    }
  }
}

// ---- TrivialAugmentWide --------------------------------------------------------------

float TrivialAugmentMagnitude(AugmentOp op, int bin, int num_magnitude_bins) {
  switch (op) {
    case AugmentOp::kShearX:
    case AugmentOp::kShearY:
    case AugmentOp::kBrightness:
    case AugmentOp::kColor:
    case AugmentOp::kContrast:
    case AugmentOp::kSharpness:
      return LinspaceF(0.0f, 0.99f, num_magnitude_bins, bin);
    case AugmentOp::kTranslateX:
    case AugmentOp::kTranslateY:
      return LinspaceF(0.0f, 32.0f, num_magnitude_bins, bin);
    case AugmentOp::kRotate:
      return LinspaceF(0.0f, 135.0f, num_magnitude_bins, bin);
    case AugmentOp::kPosterize: {
      // (8 - (torch.arange(n) / ((n - 1) / 6))).round().int(), in float32
      const float divisor = static_cast<float>((num_magnitude_bins - 1) / 6.0);
      return std::nearbyint(8.0f - static_cast<float>(bin) / divisor);
    }
    case AugmentOp::kSolarize:
      return LinspaceF(1.0f, 0.0f, num_magnitude_bins, bin);
    default:
      return 0.0f;
  }
}

AugmentParams SampleTrivialAugmentWide(int num_magnitude_bins, Rng& rng) {
  AugmentParams params;
  params.op = static_cast<AugmentOp>(rng.Below(kNumAugmentOps));
  if (!HasMagnitude(params.op)) return params;  // torchvision draws no bin for these
  const int bin = static_cast<int>(rng.Below(static_cast<uint64_t>(num_magnitude_bins)));
  params.magnitude = TrivialAugmentMagnitude(params.op, bin, num_magnitude_bins);
  if (IsSigned(params.op) && rng.Uniform() <= 0.5) params.magnitude = -params.magnitude;
  return params;
}

void ApplyAugment(const AugmentParams& params, const std::array<uint8_t, 3>& fill, RgbImage& image,
                  RgbImage* scratch) {
  const double mag = params.magnitude;
  const double half_w = 0.5 * image.width, half_h = 0.5 * image.height;
  double m[6];
  switch (params.op) {
    case AugmentOp::kIdentity:
      return;
    case AugmentOp::kShearX:
      // affine(shear=[degrees(atan(mag)), 0], center=[0, 0]): the top-left corner is fixed.
      InverseAffineMatrix(-half_w, -half_h, 0.0, 0.0, 0.0, Degrees(std::atan(mag)), 0.0, m);
      break;
    case AugmentOp::kShearY:
      InverseAffineMatrix(-half_w, -half_h, 0.0, 0.0, 0.0, 0.0, Degrees(std::atan(mag)), m);
      break;
    case AugmentOp::kTranslateX:
      InverseAffineMatrix(0.0, 0.0, 0.0, std::trunc(mag), 0.0, 0.0, 0.0, m);
      break;
    case AugmentOp::kTranslateY:
      InverseAffineMatrix(0.0, 0.0, 0.0, 0.0, std::trunc(mag), 0.0, 0.0, m);
      break;
    case AugmentOp::kRotate:
      // rotate(angle) is affine(-angle) about the centre.
      InverseAffineMatrix(0.0, 0.0, -mag, 0.0, 0.0, 0.0, 0.0, m);
      break;
    case AugmentOp::kBrightness:
      return AdjustBrightness(image, static_cast<float>(1.0 + mag));  // mul rounds it to float
    case AugmentOp::kColor:
      return SaturationImpl(image, 1.0 + mag);
    case AugmentOp::kContrast:
      return ContrastImpl(image, 1.0 + mag);
    case AugmentOp::kSharpness:
      return AdjustSharpness(image, 1.0 + mag, scratch);
    case AugmentOp::kPosterize:
      return Posterize(image, static_cast<int>(mag));
    case AugmentOp::kSolarize:
      return Solarize(image, 255.0 * mag);
    case AugmentOp::kAutoContrast:
      return AutoContrast(image);
    case AugmentOp::kEqualize:
      return Equalize(image);
  }
  if (image.pixels.empty()) return;
  AffineNearest(image, m, fill, scratch);
  std::swap(image, *scratch);
}

// ---- RandomErasing -------------------------------------------------------------------

ErasingParams SampleRandomErasing(const RandomErasingOptions& options, int image_height,
                                  int image_width, Rng& rng) {
  ErasingParams params;
  if (!(rng.Uniform() < options.p)) return params;  // torch.rand(1) >= p: skip
  const double area = static_cast<double>(image_height) * image_width;
  const double log_r0 = std::log(static_cast<double>(options.ratio[0]));
  const double log_r1 = std::log(static_cast<double>(options.ratio[1]));
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double erase_area = area * rng.Uniform(options.scale[0], options.scale[1]);
    const double aspect = std::exp(rng.Uniform(log_r0, log_r1));
    // Python's round() is half to even, as nearbyint in the default rounding mode.
    const int h = static_cast<int>(std::nearbyint(std::sqrt(erase_area * aspect)));
    const int w = static_cast<int>(std::nearbyint(std::sqrt(erase_area / aspect)));
    if (!(h < image_height && w < image_width)) continue;
    params.erase = true;
    params.height = h;
    params.width = w;
    params.top = static_cast<int>(rng.Below(static_cast<uint64_t>(image_height - h) + 1));
    params.left = static_cast<int>(rng.Below(static_cast<uint64_t>(image_width - w) + 1));
    return params;
  }
  return params;
}

void EraseU8(const ErasingParams& params, const std::array<uint8_t, 3>& value, RgbImage& image) {
  if (!params.erase) return;
  for (int y = params.top; y < params.top + params.height; ++y) {
    uint8_t* p = image.row(y) + static_cast<size_t>(params.left) * 3;
    for (int x = 0; x < params.width; ++x, p += 3) {
      p[0] = value[0];
      p[1] = value[1];
      p[2] = value[2];
    }
  }
}

}  // namespace ferry
