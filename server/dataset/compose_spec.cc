#include "server/dataset/compose_spec.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ferry {
namespace {

using ferry::v1::TransformOp;
using Kind = ComposeStep::Kind;
using Floats = google::protobuf::RepeatedField<float>;

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", what));
}

// A [min, max] pair: none (the default), or two values.
absl::Status Pair(const Floats& values, const std::string& field, double out[2]) {
  if (values.empty()) return absl::OkStatus();
  if (values.size() != 2) {
    return Bad(field, absl::StrCat("takes 2 values [min, max] (got ", values.size(), ")"));
  }
  out[0] = values[0];
  out[1] = values[1];
  return absl::OkStatus();
}

absl::Status Pair(const Floats& values, const std::string& field, float out[2]) {
  double d[2] = {out[0], out[1]};
  FERRY_RETURN_IF_ERROR(Pair(values, field, d));
  out[0] = static_cast<float>(d[0]);
  out[1] = static_cast<float>(d[1]);
  return absl::OkStatus();
}

// 0, 1 (every channel) or 3 values of 0..255.
absl::Status Fill(const google::protobuf::RepeatedField<uint32_t>& values, const std::string& field,
                  std::array<uint8_t, 3>* out) {
  if (values.size() != 0 && values.size() != 1 && values.size() != 3) {
    return Bad(field, absl::StrCat("takes 1 or 3 values (RGB) (got ", values.size(), ")"));
  }
  for (int c = 0; c < 3 && !values.empty(); ++c) {
    const uint32_t v = values[values.size() == 1 ? 0 : c];
    if (v > 255) return Bad(field, absl::StrCat("values must be in [0, 255] (got ", v, ")"));
    (*out)[c] = static_cast<uint8_t>(v);
  }
  return absl::OkStatus();
}

// 1 or 3 floats (`required`), or also none.
absl::Status Channels(const Floats& values, const std::string& field, bool required, float out[3]) {
  if (values.empty() && !required) return absl::OkStatus();
  if (values.size() != 1 && values.size() != 3) {
    return Bad(field, absl::StrCat("takes 1 or 3 values (RGB) (got ", values.size(), ")"));
  }
  for (int c = 0; c < 3; ++c) out[c] = values[values.size() == 1 ? 0 : c];
  return absl::OkStatus();
}

// ColorJitter's _check_input: one value v means [center - v, center + v] (clipped at 0 for
// the factors), two are [min, max]; a range that is only the centre applies nothing.
absl::Status JitterRange(const Floats& values, const std::string& field, bool is_hue, bool* set,
                         float range[2]) {
  if (values.empty()) return absl::OkStatus();
  const float center = is_hue ? 0.0f : 1.0f;
  if (values.size() == 1) {
    const float v = values[0];
    if (!(v >= 0) || !std::isfinite(v)) {
      return Bad(field, absl::StrCat("must be a non-negative number (got ", v, ")"));
    }
    range[0] = is_hue ? -v : std::max(0.0f, center - v);
    range[1] = center + v;
  } else if (values.size() == 2) {
    range[0] = values[0];
    range[1] = values[1];
  } else {
    return Bad(field, absl::StrCat("takes 1 or 2 values (got ", values.size(), ")"));
  }
  const float lo = is_hue ? -0.5f : 0.0f, hi = is_hue ? 0.5f : 1e6f;
  if (!(range[0] >= lo && range[0] <= range[1] && range[1] <= hi)) {
    return Bad(field,
               absl::StrCat("must be a range [min, max] within [", lo, ", ",
                            is_hue ? "0.5]" : "inf)", " (got [", range[0], ", ", range[1], "])"));
  }
  *set = !(range[0] == center && range[1] == center);
  return absl::OkStatus();
}

absl::StatusOr<ComposeStep> StepFromSpec(const TransformOp& op, const std::string& at) {
  ComposeStep s;
  switch (op.op_case()) {
    case TransformOp::kRandomResizedCrop: {
      const auto& m = op.random_resized_crop();
      s.kind = Kind::kRandomResizedCrop;
      s.size = static_cast<int>(std::min<uint32_t>(m.size(), 1u << 30));
      FERRY_RETURN_IF_ERROR(Pair(m.scale(), at + ".random_resized_crop.scale", s.scale));
      FERRY_RETURN_IF_ERROR(Pair(m.ratio(), at + ".random_resized_crop.ratio", s.ratio));
      s.full_decode = m.full_decode();
      return s;
    }
    case TransformOp::kResize:
      s.kind = Kind::kResize;
      s.size = static_cast<int>(std::min<uint32_t>(op.resize().size(), 1u << 30));
      s.full_decode = op.resize().full_decode();
      return s;
    case TransformOp::kCenterCrop:
      s.kind = Kind::kCenterCrop;
      s.size = static_cast<int>(std::min<uint32_t>(op.center_crop().size(), 1u << 30));
      return s;
    case TransformOp::kRandomCrop: {
      const auto& m = op.random_crop();
      const std::string field = at + ".random_crop";
      s.kind = Kind::kRandomCrop;
      s.size = static_cast<int>(std::min<uint32_t>(m.size(), 1u << 30));
      const auto& pad = m.padding();
      auto at_most = [](uint32_t v) { return static_cast<int>(std::min<uint32_t>(v, 1u << 30)); };
      if (pad.size() == 1) {
        for (int& p : s.padding) p = at_most(pad[0]);
      } else if (pad.size() == 2) {  // [left/right, top/bottom]
        s.padding[0] = s.padding[2] = at_most(pad[0]);
        s.padding[1] = s.padding[3] = at_most(pad[1]);
      } else if (pad.size() == 4) {  // [left, top, right, bottom]
        for (int i = 0; i < 4; ++i) s.padding[i] = at_most(pad[i]);
      } else if (!pad.empty()) {
        return Bad(field + ".padding",
                   absl::StrCat("takes 1, 2 or 4 values (got ", pad.size(), ")"));
      }
      s.pad_if_needed = m.pad_if_needed();
      FERRY_RETURN_IF_ERROR(Fill(m.fill(), field + ".fill", &s.fill));
      const std::string& mode = m.padding_mode();
      if (mode.empty() || mode == "constant") {
        s.padding_mode = PaddingMode::kConstant;
      } else if (mode == "edge") {
        s.padding_mode = PaddingMode::kEdge;
      } else if (mode == "reflect") {
        s.padding_mode = PaddingMode::kReflect;
      } else if (mode == "symmetric") {
        s.padding_mode = PaddingMode::kSymmetric;
      } else {
        return Bad(field + ".padding_mode",
                   absl::StrCat("must be \"constant\", \"edge\", \"reflect\" or \"symmetric\" "
                                "(got \"",
                                mode, "\")"));
      }
      return s;
    }
    case TransformOp::kRandomHorizontalFlip:
    case TransformOp::kRandomVerticalFlip: {
      const bool h = op.op_case() == TransformOp::kRandomHorizontalFlip;
      const auto& m = h ? op.random_horizontal_flip() : op.random_vertical_flip();
      s.kind = h ? Kind::kHorizontalFlip : Kind::kVerticalFlip;
      s.p = m.has_p() ? m.p() : 0.5f;
      return s;
    }
    case TransformOp::kColorJitter: {
      const auto& m = op.color_jitter();
      const std::string field = at + ".color_jitter";
      s.kind = Kind::kColorJitter;
      ColorJitterOptions& j = s.jitter;
      FERRY_RETURN_IF_ERROR(JitterRange(m.brightness(), field + ".brightness", false,
                                        &j.has_brightness, j.brightness));
      FERRY_RETURN_IF_ERROR(
          JitterRange(m.contrast(), field + ".contrast", false, &j.has_contrast, j.contrast));
      FERRY_RETURN_IF_ERROR(JitterRange(m.saturation(), field + ".saturation", false,
                                        &j.has_saturation, j.saturation));
      FERRY_RETURN_IF_ERROR(JitterRange(m.hue(), field + ".hue", true, &j.has_hue, j.hue));
      return s;
    }
    case TransformOp::kRandomGrayscale:
      s.kind = Kind::kRandomGrayscale;
      s.p = op.random_grayscale().has_p() ? op.random_grayscale().p() : 0.1f;
      return s;
    case TransformOp::kTrivialAugmentWide: {
      const auto& m = op.trivial_augment_wide();
      s.kind = Kind::kTrivialAugmentWide;
      s.num_magnitude_bins = m.num_magnitude_bins() == 0
                                 ? 31
                                 : static_cast<int>(std::min(m.num_magnitude_bins(), 1u << 30));
      FERRY_RETURN_IF_ERROR(Fill(m.fill(), at + ".trivial_augment_wide.fill", &s.fill));
      return s;
    }
    case TransformOp::kNormalize:
      s.kind = Kind::kNormalize;
      FERRY_RETURN_IF_ERROR(Channels(op.normalize().mean(), at + ".normalize.mean", true, s.mean));
      FERRY_RETURN_IF_ERROR(Channels(op.normalize().std(), at + ".normalize.std", true, s.std));
      return s;
    case TransformOp::kRandomErasing: {
      const auto& m = op.random_erasing();
      const std::string field = at + ".random_erasing";
      s.kind = Kind::kRandomErasing;
      s.erasing.p = m.has_p() ? m.p() : 0.5f;
      FERRY_RETURN_IF_ERROR(Pair(m.scale(), field + ".scale", s.erasing.scale));
      FERRY_RETURN_IF_ERROR(Pair(m.ratio(), field + ".ratio", s.erasing.ratio));
      FERRY_RETURN_IF_ERROR(Channels(m.value(), field + ".value", false, s.value));
      return s;
    }
    case TransformOp::OP_NOT_SET:
      break;
  }
  return Bad(at,
             "sets no op: set one of random_resized_crop, resize, center_crop, random_crop, "
             "random_horizontal_flip, random_vertical_flip, color_jitter, random_grayscale, "
             "trivial_augment_wide, normalize, random_erasing");
}

}  // namespace

absl::StatusOr<std::vector<ComposeStep>> ComposeStepsFromSpec(const ferry::v1::Compose& compose) {
  std::vector<ComposeStep> steps;
  for (int i = 0; i < compose.ops_size(); ++i) {
    FERRY_ASSIGN_OR_RETURN(
        ComposeStep step,
        StepFromSpec(compose.ops(i), absl::StrCat("transform.compose.ops[", i, "]")));
    steps.push_back(step);
  }
  return steps;
}

absl::StatusOr<ComposedTransform::Target> ComposeTargetFor(const ferry::v1::JobSpec& spec,
                                                           const SourceOptions& options,
                                                           bool exif_orientation) {
  ComposedTransform::Target target;
  target.exif_orientation = exif_orientation;
  const ferry::v1::ImageOutput& output = spec.image_output();
  const ferry::v1::Compose& compose = spec.transform().compose();
  const ferry::v1::TransformOp::Normalize* normalize = nullptr;
  for (const ferry::v1::TransformOp& op : compose.ops()) {
    if (op.has_normalize()) normalize = &op.normalize();
  }
  if (normalize != nullptr && output.dtype() == ferry::v1::UINT8) {
    return absl::InvalidArgumentError(
        "image_output.dtype is UINT8 but transform.compose has a Normalize, which makes float "
        "images: leave image_output.dtype unset (FLOAT32) or pick FLOAT32, FLOAT16 or BFLOAT16");
  }
  if (normalize != nullptr && (output.mean_size() != 0 || output.std_size() != 0)) {
    float mean[3], std[3];
    FERRY_RETURN_IF_ERROR(Channels(normalize->mean(), "normalize.mean", true, mean));
    FERRY_RETURN_IF_ERROR(Channels(normalize->std(), "normalize.std", true, std));
    for (int c = 0; c < 3; ++c) {
      const bool same_mean = output.mean_size() != 3 || output.mean(c) == mean[c];
      const bool same_std = output.std_size() != 3 || output.std(c) == std[c];
      if (!same_mean || !same_std) {
        return absl::InvalidArgumentError(
            "image_output.mean / std differ from transform.compose's Normalize: give them in "
            "one place (the Normalize)");
      }
    }
  }
  const ferry::v1::DType dtype = output.dtype() != ferry::v1::DTYPE_UNSPECIFIED ? output.dtype()
                                 : normalize != nullptr                         ? ferry::v1::FLOAT32
                                                                                : ferry::v1::UINT8;
  target.device_program = options.device_images && dtype != ferry::v1::UINT8;
  for (int c = 0; c < 3; ++c) {
    if (output.mean_size() == 3) target.device_mean[c] = output.mean(c);
    if (output.std_size() == 3) target.device_std[c] = output.std(c);
  }
  return target;
}

}  // namespace ferry
