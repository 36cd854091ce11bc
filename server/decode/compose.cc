#include "server/decode/compose.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/decode/exif.h"
#include "server/kernels/photometric.h"

namespace ferry {
namespace {

using Kind = ComposeStep::Kind;

constexpr int kMaxSide = 16384;

bool IsPhotometric(Kind kind) {
  return kind == Kind::kColorJitter || kind == Kind::kRandomGrayscale || kind == Kind::kNormalize ||
         kind == Kind::kRandomErasing;
}

bool IsProbability(float p) { return p >= 0 && p <= 1; }  // false for NaN

std::string Where(size_t i, Kind kind) {
  return absl::StrCat("ops[", i, "] (", ComposeStepName(kind), "): ");
}

// Ops a step adds to a PhotometricProgram at most.
int ProgramOps(const ComposeStep& step) { return step.kind == Kind::kColorJitter ? 4 : 1; }

absl::Status CheckStep(size_t i, const ComposeStep& s) {
  const std::string where = Where(i, s.kind);
  switch (s.kind) {
    case Kind::kRandomResizedCrop:
      if (!(s.scale[0] > 0 && s.scale[0] <= s.scale[1] && std::isfinite(s.scale[1]))) {
        return absl::InvalidArgumentError(absl::StrCat(where, "scale must be 0 < min <= max (got [",
                                                       s.scale[0], ", ", s.scale[1], "])"));
      }
      if (!(s.ratio[0] > 0 && s.ratio[0] <= s.ratio[1] && std::isfinite(s.ratio[1]))) {
        return absl::InvalidArgumentError(absl::StrCat(where, "ratio must be 0 < min <= max (got [",
                                                       s.ratio[0], ", ", s.ratio[1], "])"));
      }
      [[fallthrough]];
    case Kind::kResize:
    case Kind::kCenterCrop:
    case Kind::kRandomCrop:
      if (s.size < 1 || s.size > kMaxSide) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "size must be in [1, ", kMaxSide, "] (got ", s.size, ")"));
      }
      for (int pad : s.padding) {
        if (pad < 0 || pad > kMaxSide) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, "padding must be in [0, ", kMaxSide, "] (got ", pad, ")"));
        }
      }
      return absl::OkStatus();
    case Kind::kHorizontalFlip:
    case Kind::kVerticalFlip:
    case Kind::kRandomGrayscale:
      if (!IsProbability(s.p)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "p must be in [0, 1] (got ", s.p, ")"));
      }
      return absl::OkStatus();
    case Kind::kColorJitter: {
      const ColorJitterOptions& j = s.jitter;
      const struct {
        bool set;
        const float* range;
        const char* name;
        float lo, hi;
      } ranges[] = {{j.has_brightness, j.brightness, "brightness", 0, 1e6f},
                    {j.has_contrast, j.contrast, "contrast", 0, 1e6f},
                    {j.has_saturation, j.saturation, "saturation", 0, 1e6f},
                    {j.has_hue, j.hue, "hue", -0.5f, 0.5f}};
      for (const auto& r : ranges) {
        if (r.set && !(r.range[0] >= r.lo && r.range[0] <= r.range[1] && r.range[1] <= r.hi)) {
          return absl::InvalidArgumentError(absl::StrCat(where, r.name, " must be a range within [",
                                                         r.lo, ", ", r.hi, "] (got [", r.range[0],
                                                         ", ", r.range[1], "])"));
        }
      }
      return absl::OkStatus();
    }
    case Kind::kTrivialAugmentWide:
      if (s.num_magnitude_bins < 2 || s.num_magnitude_bins > 1000) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "num_magnitude_bins must be in [2, 1000] (got ", s.num_magnitude_bins, ")"));
      }
      return absl::OkStatus();
    case Kind::kNormalize:
      for (int c = 0; c < 3; ++c) {
        if (!(s.std[c] > 0 && std::isfinite(s.std[c]) && std::isfinite(s.mean[c]))) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, "std must be positive and mean finite (got mean[", c,
                           "] = ", s.mean[c], ", std[", c, "] = ", s.std[c], ")"));
        }
      }
      return absl::OkStatus();
    case Kind::kRandomErasing: {
      const RandomErasingOptions& e = s.erasing;
      if (!IsProbability(e.p)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "p must be in [0, 1] (got ", e.p, ")"));
      }
      if (!(e.scale[0] >= 0 && e.scale[0] <= e.scale[1] && e.scale[1] <= 1)) {
        return absl::InvalidArgumentError(absl::StrCat(where,
                                                       "scale must be 0 <= min <= max <= 1 (got [",
                                                       e.scale[0], ", ", e.scale[1], "])"));
      }
      if (!(e.ratio[0] > 0 && e.ratio[0] <= e.ratio[1] && std::isfinite(e.ratio[1]))) {
        return absl::InvalidArgumentError(absl::StrCat(where, "ratio must be 0 < min <= max (got [",
                                                       e.ratio[0], ", ", e.ratio[1], "])"));
      }
      for (float v : s.value) {
        if (!std::isfinite(v)) {
          return absl::InvalidArgumentError(absl::StrCat(where, "value must be finite"));
        }
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("ops[", i, "]: unknown op"));
}

// torchvision's round(x): ties to even (the default rounding mode).
int RoundHalfEven(double x) { return static_cast<int>(std::nearbyint(x)); }

void Swap(RgbImage& a, RgbImage& b) { std::swap(a, b); }

// RandomCrop's padding, size check and draws (v2.RandomCrop._get_params), then pad + crop.
// OK when a step may make a `width` x `height` image: at most `max_pixels`, the per-sample
// bound every intermediate image of a Compose stays within (Run says which). Checked before
// the image is allocated, so no sample can take more memory than that.
absl::Status CheckPixels(absl::string_view step, int64_t width, int64_t height, uint64_t max_pixels,
                         const RgbImage& from) {
  if (width > 0 && height > 0 &&
      static_cast<uint64_t>(width) * static_cast<uint64_t>(height) <= max_pixels) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      step, " would turn this ", from.width, "x", from.height, " image into ", width, "x", height,
      " (", width * height, " pixels), more than the ", max_pixels,
      " any step of a transform may make (the larger of max_image_pixels and the output "
      "size); the sample is skipped as bad. Crop before resizing, or bound the longer side"));
}

absl::Status RandomCropImage(const ComposeStep& s, Rng& rng, uint64_t max_pixels,
                             ComposeScratch& scratch) {
  RgbImage& image = scratch.image;
  int left = s.padding[0], top = s.padding[1], right = s.padding[2], bottom = s.padding[3];
  {
    // The padded image, as below, in 64 bits: paddings and sizes each fit an int, their
    // sums may not.
    int64_t h = int64_t{image.height} + top + bottom, w = int64_t{image.width} + left + right;
    if (s.pad_if_needed && h < s.size) h = 2 * int64_t{s.size} - h;
    if (s.pad_if_needed && w < s.size) w = 2 * int64_t{s.size} - w;
    FERRY_RETURN_IF_ERROR(CheckPixels("RandomCrop's padding", w, h, max_pixels, image));
  }
  int padded_h = image.height + top + bottom;
  int padded_w = image.width + left + right;
  if (s.pad_if_needed && padded_h < s.size) {
    const int diff = s.size - padded_h;
    top += diff;
    bottom += diff;
    padded_h += 2 * diff;
  }
  if (s.pad_if_needed && padded_w < s.size) {
    const int diff = s.size - padded_w;
    left += diff;
    right += diff;
    padded_w += 2 * diff;
  }
  if (padded_h < s.size || padded_w < s.size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RandomCrop: the image (", image.width, "x", image.height, " after padding: ", padded_w,
        "x", padded_h, ") is smaller than size ", s.size, "; set pad_if_needed or crop less"));
  }
  const int crop_top = padded_h > s.size ? static_cast<int>(rng.Below(padded_h - s.size + 1)) : 0;
  const int crop_left = padded_w > s.size ? static_cast<int>(rng.Below(padded_w - s.size + 1)) : 0;
  if (left || top || right || bottom) {
    if (s.padding_mode == PaddingMode::kReflect &&
        (std::max(left, right) >= image.width || std::max(top, bottom) >= image.height)) {
      return absl::InvalidArgumentError(
          absl::StrCat("RandomCrop: padding_mode 'reflect' needs padding smaller than the image (",
                       image.width, "x", image.height, "); use 'symmetric' or 'edge'"));
    }
    Pad(image, left, top, right, bottom, s.padding_mode, s.fill, &scratch.other);
    Swap(scratch.image, scratch.other);
  }
  if (scratch.image.width != s.size || scratch.image.height != s.size) {
    Crop(scratch.image, crop_top, crop_left, s.size, s.size, &scratch.other);
    Swap(scratch.image, scratch.other);
  }
  return absl::OkStatus();
}

// v2.functional.center_crop: zero padding when the image is smaller, then the centre.
absl::Status CenterCropImage(int size, uint64_t max_pixels, ComposeScratch& scratch) {
  RgbImage& image = scratch.image;
  FERRY_RETURN_IF_ERROR(CheckPixels("CenterCrop's padding", std::max(image.width, size),
                                    std::max(image.height, size), max_pixels, image));
  if (image.width < size || image.height < size) {
    const int dw = std::max(0, size - image.width), dh = std::max(0, size - image.height);
    Pad(image, dw / 2, dh / 2, (dw + 1) / 2, (dh + 1) / 2, PaddingMode::kConstant, {0, 0, 0},
        &scratch.other);
    Swap(scratch.image, scratch.other);
  }
  if (scratch.image.width == size && scratch.image.height == size) return absl::OkStatus();
  const int top = RoundHalfEven((scratch.image.height - size) / 2.0);
  const int left = RoundHalfEven((scratch.image.width - size) / 2.0);
  Crop(scratch.image, top, left, size, size, &scratch.other);
  Swap(scratch.image, scratch.other);
  return absl::OkStatus();
}

void ResizeBox(const CropBox& box, int out_w, int out_h, ComposeScratch& scratch) {
  const RgbImage& image = scratch.image;
  scratch.other.Resize(out_w, out_h);
  ResizeBilinearAntialias(image.pixels.data(), image.width, image.height, image.width * 3, box,
                          scratch.other.pixels.data(), out_w, out_h);
  Swap(scratch.image, scratch.other);
}

// v2.functional.resize(size) for an int size: the shorter side becomes `size`, the longer
// int(size * long / short).
absl::Status ResizeShorter(int size, uint64_t max_pixels, ComposeScratch& scratch) {
  const int w = scratch.image.width, h = scratch.image.height;
  const int shorter = std::min(w, h), longer = std::max(w, h);
  const int64_t new_longer = static_cast<int64_t>(size) * longer / shorter;
  FERRY_RETURN_IF_ERROR(CheckPixels(absl::StrCat("Resize(", size, ")"), w <= h ? size : new_longer,
                                    w <= h ? new_longer : size, max_pixels, scratch.image));
  const int out_w = w <= h ? size : static_cast<int>(new_longer);
  const int out_h = w <= h ? static_cast<int>(new_longer) : size;
  if (out_w == w && out_h == h) return absl::OkStatus();
  ResizeBox(CropBox{0, 0, w, h}, out_w, out_h, scratch);
  return absl::OkStatus();
}

std::array<uint8_t, 3> ToU8(const float value[3]) {
  std::array<uint8_t, 3> out;
  for (int c = 0; c < 3; ++c) {
    // As assigning a float tensor into a uint8 one: truncation (values kept in range).
    out[c] = static_cast<uint8_t>(std::clamp(value[c], 0.0f, 255.0f));
  }
  return out;
}

}  // namespace

const char* ComposeStepName(ComposeStep::Kind kind) {
  switch (kind) {
    case Kind::kRandomResizedCrop:
      return "RandomResizedCrop";
    case Kind::kResize:
      return "Resize";
    case Kind::kCenterCrop:
      return "CenterCrop";
    case Kind::kRandomCrop:
      return "RandomCrop";
    case Kind::kHorizontalFlip:
      return "RandomHorizontalFlip";
    case Kind::kVerticalFlip:
      return "RandomVerticalFlip";
    case Kind::kColorJitter:
      return "ColorJitter";
    case Kind::kRandomGrayscale:
      return "RandomGrayscale";
    case Kind::kTrivialAugmentWide:
      return "TrivialAugmentWide";
    case Kind::kNormalize:
      return "Normalize";
    case Kind::kRandomErasing:
      return "RandomErasing";
  }
  return "?";
}

absl::StatusOr<ComposedTransform> ComposedTransform::Create(std::vector<ComposeStep> steps,
                                                            const Target& target) {
  if (steps.empty()) {
    return absl::InvalidArgumentError(
        "ops is empty: a Compose needs at least a crop to a fixed size (e.g. "
        "RandomResizedCrop(224))");
  }
  ComposedTransform t;
  int known = -1;  // the side of the (square) image after the op, -1 when it varies
  int normalize_at = -1;
  for (size_t i = 0; i < steps.size(); ++i) {
    const ComposeStep& s = steps[i];
    FERRY_RETURN_IF_ERROR(CheckStep(i, s));
    if (normalize_at >= 0 && s.kind != Kind::kRandomErasing) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(i, s.kind), "comes after Normalize (ops[", normalize_at,
          "]), which makes the image float; only RandomErasing may follow it. Move it before "
          "Normalize"));
    }
    switch (s.kind) {
      case Kind::kRandomResizedCrop:
      case Kind::kCenterCrop:
      case Kind::kRandomCrop:
        known = s.size;
        break;
      case Kind::kResize:
        if (known > 0) known = s.size;
        break;
      case Kind::kNormalize:
        normalize_at = static_cast<int>(i);
        break;
      default:
        break;
    }
  }
  if (known < 0) {
    return absl::InvalidArgumentError(
        "ops: the output size depends on each image: after the last Resize (which keeps the "
        "aspect ratio) add a crop to a fixed size (CenterCrop, RandomCrop or "
        "RandomResizedCrop)");
  }
  t.size_ = known;
  t.target_ = target;
  if (target.device_program) {
    size_t k = steps.size();
    while (k > 0 && IsPhotometric(steps[k - 1].kind)) --k;
    int ops = normalize_at >= 0 ? 0 : 1;  // the appended Normalize
    for (size_t i = k; i < steps.size(); ++i) ops += ProgramOps(steps[i]);
    if (ops > kMaxPhotometricOps) {
      return absl::InvalidArgumentError(
          absl::StrCat("ops[", k, "] on: the trailing photometric ops make up to ", ops,
                       " GPU operations per image; at most ", kMaxPhotometricOps, " fit"));
    }
    t.device_steps_ = static_cast<int>(k);
  } else {
    t.float_output_ = normalize_at >= 0;
  }
  // A leading RandomResizedCrop, or Resize + CenterCrop (to at most the resized side),
  // runs inside the decode.
  if (steps[0].kind == Kind::kRandomResizedCrop) {
    t.fused_steps_ = 1;
  } else if (steps.size() >= 2 && steps[0].kind == Kind::kResize &&
             steps[1].kind == Kind::kCenterCrop && steps[1].size <= steps[0].size) {
    t.fused_steps_ = 2;
  }
  t.steps_ = std::move(steps);
  return t;
}

size_t ComposedTransform::image_row_bytes() const {
  const size_t pixels = static_cast<size_t>(size_) * size_ * 3;
  return float_output_ ? pixels * sizeof(float) : pixels;
}

ImageTransform ComposedTransform::FusedTransform() const {
  ImageTransform fused;
  if (fused_steps_ == 1) {
    const ComposeStep& s = steps_[0];
    fused = ImageTransform::RandomResizedCrop(s.size, /*flip=*/false);
    fused.scale_min = s.scale[0];
    fused.scale_max = s.scale[1];
    fused.ratio_min = s.ratio[0];
    fused.ratio_max = s.ratio[1];
    fused.full_decode = s.full_decode;
  } else if (fused_steps_ == 2) {
    fused = ImageTransform::ResizeCenterCrop(steps_[1].size, steps_[0].size);
    fused.full_decode = steps_[0].full_decode;
  }
  fused.exif_orientation = target_.exif_orientation;
  return fused;
}

bool ComposedTransform::DecodeOnly() const {
  const int cpu_end = device_steps_ >= 0 ? device_steps_ : static_cast<int>(steps_.size());
  return fused_steps_ > 0 && fused_steps_ == cpu_end && !float_output_;
}

absl::Status ComposedTransform::Run(ImageDecoder& decoder, absl::Span<const uint8_t> bytes,
                                    uint64_t sample_seed, ComposeScratch& scratch,
                                    absl::Span<uint8_t> image_row,
                                    absl::Span<uint8_t> program_row) const {
  if (image_row.size() != image_row_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image row holds ", image_row.size(), " bytes; the transform writes ", image_row_bytes()));
  }
  if (emits_program() && program_row.size() != sizeof(PhotometricProgram)) {
    return absl::InvalidArgumentError(absl::StrCat("program row holds ", program_row.size(),
                                                   " bytes, not ", sizeof(PhotometricProgram)));
  }
  RgbImage& image = scratch.image;
  // Every image a step makes stays within this, checked before it is allocated: a sample
  // costs at most a few times this much memory, whatever its size and the ops' arguments.
  const uint64_t max_pixels =
      std::max<uint64_t>(decoder.limits().max_image_pixels, uint64_t(size_) * uint64_t(size_));
  // Decode, with the leading crop when it can run inside the decode.
  if (fused_steps_ > 0) {
    const ImageTransform fused = FusedTransform();
    image.Resize(fused.size, fused.size);
    Rng rng(MixSeed(sample_seed, 0));
    FERRY_RETURN_IF_ERROR(
        DecodeAndTransform(decoder, bytes, fused, rng, absl::MakeSpan(image.pixels)));
  } else {
    int w = 0, h = 0;
    FERRY_RETURN_IF_ERROR(decoder.DecodeRgb(bytes, &image.pixels, &w, &h));
    image.width = w;
    image.height = h;
    const int orientation = target_.exif_orientation ? ReadExifOrientation(bytes) : 1;
    if (orientation != 1) {
      int uw = 0, uh = 0;
      OrientedSize(orientation, w, h, &uw, &uh);
      scratch.other.Resize(uw, uh);
      ApplyExifOrientation(orientation, image.pixels.data(), w, h, scratch.other.pixels.data());
      Swap(scratch.image, scratch.other);
    }
  }

  const size_t cpu_end = device_steps_ >= 0 ? static_cast<size_t>(device_steps_) : steps_.size();
  bool normalized = false;  // the image lives in image_row as CHW float32 from here on
  std::vector<float> chw;
  for (size_t i = static_cast<size_t>(fused_steps_); i < cpu_end; ++i) {
    const ComposeStep& s = steps_[i];
    Rng rng(MixSeed(sample_seed, i));
    RgbImage& img = scratch.image;
    switch (s.kind) {
      case Kind::kRandomResizedCrop: {
        FERRY_RETURN_IF_ERROR(
            CheckPixels("RandomResizedCrop", s.size, s.size, max_pixels, scratch.image));
        ImageTransform params = ImageTransform::RandomResizedCrop(s.size, false);
        params.scale_min = s.scale[0];
        params.scale_max = s.scale[1];
        params.ratio_min = s.ratio[0];
        params.ratio_max = s.ratio[1];
        ResizeBox(SampleRandomResizedCrop(img.width, img.height, params, rng), s.size, s.size,
                  scratch);
        break;
      }
      case Kind::kResize:
        FERRY_RETURN_IF_ERROR(ResizeShorter(s.size, max_pixels, scratch));
        break;
      case Kind::kCenterCrop:
        FERRY_RETURN_IF_ERROR(CenterCropImage(s.size, max_pixels, scratch));
        break;
      case Kind::kRandomCrop:
        FERRY_RETURN_IF_ERROR(RandomCropImage(s, rng, max_pixels, scratch));
        break;
      case Kind::kHorizontalFlip:
        if (rng.Uniform() < s.p) HorizontalFlip(img);
        break;
      case Kind::kVerticalFlip:
        if (rng.Uniform() < s.p) VerticalFlip(img);
        break;
      case Kind::kColorJitter:
        ApplyColorJitter(SampleColorJitter(s.jitter, rng), img);
        break;
      case Kind::kRandomGrayscale:
        if (rng.Uniform() < s.p) RgbToGrayscale(img);
        break;
      case Kind::kTrivialAugmentWide:
        ApplyAugment(SampleTrivialAugmentWide(s.num_magnitude_bins, rng), s.fill, img,
                     &scratch.other);
        break;
      case Kind::kNormalize: {
        // ToDtype(float32, scale=True) then Normalize, into CHW.
        const size_t plane = static_cast<size_t>(img.width) * img.height;
        chw.resize(plane * 3);
        for (int c = 0; c < 3; ++c) {
          const float scale = 1.0f / (255.0f * s.std[c]);
          const float shift = -s.mean[c] / s.std[c];
          float* out = chw.data() + plane * c;
          const uint8_t* in = img.pixels.data() + c;
          for (size_t p = 0; p < plane; ++p) out[p] = static_cast<float>(in[p * 3]) * scale + shift;
        }
        normalized = true;
        break;
      }
      case Kind::kRandomErasing: {
        const ErasingParams e = SampleRandomErasing(s.erasing, img.height, img.width, rng);
        if (!e.erase) break;
        if (!normalized) {
          EraseU8(e, ToU8(s.value), img);
          break;
        }
        const size_t plane = static_cast<size_t>(img.width) * img.height;
        for (int c = 0; c < 3; ++c) {
          for (int y = e.top; y < e.top + e.height; ++y) {
            float* row = chw.data() + plane * c + static_cast<size_t>(y) * img.width;
            std::fill(row + e.left, row + e.left + e.width, s.value[c]);
          }
        }
        break;
      }
    }
  }
  if (scratch.image.width != size_ || scratch.image.height != size_) {
    return absl::InternalError(absl::StrCat("the transform made a ", scratch.image.width, "x",
                                            scratch.image.height, " image, not ", size_, "x",
                                            size_));
  }
  if (normalized) {
    std::memcpy(image_row.data(), chw.data(), image_row.size());
  } else {
    std::memcpy(image_row.data(), scratch.image.pixels.data(), image_row.size());
  }
  if (!emits_program()) return absl::OkStatus();
  return WriteProgram(sample_seed, program_row);
}

absl::Status ComposedTransform::WriteProgram(uint64_t sample_seed,
                                             absl::Span<uint8_t> program_row) const {
  if (!emits_program() || program_row.size() != sizeof(PhotometricProgram)) {
    return absl::InvalidArgumentError(absl::StrCat("program row holds ", program_row.size(),
                                                   " bytes, not ", sizeof(PhotometricProgram)));
  }
  const size_t cpu_end = static_cast<size_t>(device_steps_);
  // The device's share: draw its parameters here, in the same order of ops.
  PhotometricProgram program;
  auto push = [&program](const PhotometricOp& op) { program.ops[program.num_ops++] = op; };
  bool device_normalized = false;
  for (size_t i = cpu_end; i < steps_.size(); ++i) {
    const ComposeStep& s = steps_[i];
    Rng rng(MixSeed(sample_seed, i));
    switch (s.kind) {
      case Kind::kColorJitter: {
        const ColorJitterParams p = SampleColorJitter(s.jitter, rng);
        static constexpr PhotometricKind kKinds[] = {
            PhotometricKind::kBrightness, PhotometricKind::kContrast, PhotometricKind::kSaturation,
            PhotometricKind::kHue};
        for (int k : p.order) {
          if (!p.apply[k]) continue;
          PhotometricOp op;
          op.kind = static_cast<uint32_t>(kKinds[k]);
          op.a = p.factor[k];
          push(op);
        }
        break;
      }
      case Kind::kRandomGrayscale:
        if (rng.Uniform() < s.p) {
          PhotometricOp op;
          op.kind = static_cast<uint32_t>(PhotometricKind::kGrayscale);
          push(op);
        }
        break;
      case Kind::kNormalize: {
        PhotometricOp op;
        op.kind = static_cast<uint32_t>(PhotometricKind::kNormalize);
        std::copy(s.mean, s.mean + 3, op.v);
        std::copy(s.std, s.std + 3, op.w);
        push(op);
        device_normalized = true;
        break;
      }
      case Kind::kRandomErasing: {
        const ErasingParams e = SampleRandomErasing(s.erasing, size_, size_, rng);
        if (!e.erase) break;
        PhotometricOp op;
        op.kind = static_cast<uint32_t>(PhotometricKind::kErase);
        op.top = e.top;
        op.left = e.left;
        op.height = e.height;
        op.width = e.width;
        // Before Normalize the value is on the uint8 scale, as the image was.
        const std::array<uint8_t, 3> u8 = ToU8(s.value);
        for (int c = 0; c < 3; ++c) op.v[c] = device_normalized ? s.value[c] : u8[c] / 255.0f;
        push(op);
        break;
      }
      default:
        return absl::InternalError("a geometric op among the device's steps");
    }
  }
  if (!device_normalized) {
    PhotometricOp op;
    op.kind = static_cast<uint32_t>(PhotometricKind::kNormalize);
    std::copy(target_.device_mean.begin(), target_.device_mean.end(), op.v);
    std::copy(target_.device_std.begin(), target_.device_std.end(), op.w);
    push(op);
  }
  std::memcpy(program_row.data(), &program, sizeof(program));
  return absl::OkStatus();
}

}  // namespace ferry
