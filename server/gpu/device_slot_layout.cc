#include "server/gpu/device_slot_layout.h"

#include "absl/strings/str_cat.h"
#include "server/kernels/normalize.h"

namespace ferry {
namespace {

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Device slots are separate cudaMalloc allocations; 2 MiB keeps each one on its own large
// pages and its IPC mapping aligned.
constexpr size_t kDeviceSlotAlignment = 2 << 20;

}  // namespace

absl::StatusOr<DeviceSlotLayout> DeviceSlotLayout::Make(const SlotLayout& host,
                                                        const ferry::v1::ImageOutput& output) {
  DeviceSlotLayout layout;
  layout.fields = host.fields;
  const ferry::v1::DType dtype =
      output.dtype() == ferry::v1::DTYPE_UNSPECIFIED ? ferry::v1::UINT8 : output.dtype();
  if (dtype != ferry::v1::UINT8 && dtype != ferry::v1::FLOAT32 && dtype != ferry::v1::FLOAT16 &&
      dtype != ferry::v1::BFLOAT16) {
    return absl::InvalidArgumentError(
        absl::StrCat("image_output.dtype must be UINT8, FLOAT32, FLOAT16 or BFLOAT16 (got ",
                     ferry::v1::DType_Name(dtype), ")"));
  }
  if ((output.mean_size() != 0 && output.mean_size() != 3) ||
      (output.std_size() != 0 && output.std_size() != 3)) {
    return absl::InvalidArgumentError("image_output.mean and image_output.std take 3 values (RGB)");
  }
  const auto mean = kImageNetMean;
  const auto std = kImageNetStd;
  for (int c = 0; c < 3; ++c) {
    layout.mean[c] = output.mean_size() == 3 ? output.mean(c) : mean[c];
    layout.std[c] = output.std_size() == 3 ? output.std(c) : std[c];
    if (!(layout.std[c] > 0)) {
      return absl::InvalidArgumentError("image_output.std values must be positive");
    }
  }
  for (size_t f = 0; f < host.fields.size(); ++f) {
    if (host.fields[f].internal && host.fields[f].name == kPhotometricField) {
      layout.program_field = static_cast<int>(f);
    }
  }
  // A composed transform that leaves its photometric ops to the device writes their
  // programs, and its Normalize makes float images: FLOAT32 unless image_output says.
  const ferry::v1::DType image_dtype =
      layout.program_field >= 0 && output.dtype() == ferry::v1::DTYPE_UNSPECIFIED
          ? ferry::v1::FLOAT32
          : dtype;
  if (layout.program_field >= 0 && image_dtype == ferry::v1::UINT8) {
    return absl::InternalError("photometric programs for a job whose images stay UINT8");
  }
  if (image_dtype != ferry::v1::UINT8) {
    const ferry::v1::DType dtype = image_dtype;
    for (size_t f = 0; f < host.fields.size(); ++f) {
      if (host.fields[f].name == "image") layout.image_field = static_cast<int>(f);
    }
    if (layout.image_field < 0) {
      return absl::InvalidArgumentError("image_output is set but the dataset has no image field");
    }
    layout.image_dtype = dtype;
    FieldLayout& image = layout.fields[layout.image_field];
    const int64_t h = image.shape[0], w = image.shape[1], c = image.shape[2];
    image.dtype = dtype;
    image.shape = {c, h, w};
    image.row_bytes = static_cast<size_t>(c * h * w) * (dtype == ferry::v1::FLOAT32 ? 4 : 2);
  }
  for (size_t f = 0; f < host.fields.size(); ++f) {
    const FieldLayout& field = host.fields[f];
    if (field.device_dtype == ferry::v1::DTYPE_UNSPECIFIED) continue;
    const ferry::v1::DType out = field.device_dtype;
    const bool widens = (field.dtype == ferry::v1::UINT16 || field.dtype == ferry::v1::UINT32 ||
                         field.dtype == ferry::v1::INT32) &&
                        (out == ferry::v1::INT64 || out == ferry::v1::INT32) && field.dtype != out;
    if (!widens || layout.token_field >= 0 || layout.image_field >= 0) {
      // The sources set device_dtype only so (FieldLayout): a bug, not a bad request.
      return absl::InternalError(absl::StrCat(
          "field '", field.name, "' asks the device to widen ", ferry::v1::DType_Name(field.dtype),
          " to ", ferry::v1::DType_Name(out), ", which the GPU transport does not do"));
    }
    layout.token_field = static_cast<int>(f);
    layout.token_input = field.dtype;
    layout.token_dtype = out;
    FieldLayout& tokens = layout.fields[f];
    tokens.dtype = out;
    tokens.row_bytes = field.row_bytes / DTypeSize(field.dtype) * DTypeSize(out);
  }
  // The host slot's bytes that cross to the device: all but a trailing kGpuDecodeJpegField,
  // whose JPEGs nvJPEG reads from the host slot.
  size_t host_bytes = host.slot_bytes;
  if (!host.fields.empty() && host.fields.back().internal &&
      host.fields.back().name == kGpuDecodeJpegField) {
    host_bytes = host.offsets.back();
    layout.host_only_field = static_cast<int>(host.fields.size()) - 1;
  }
  size_t offset = 0;
  if (layout.converts()) {
    // The converted field first, then the staging area: a copy of the whole host slot, in
    // which the other fields are read where they land. One copy moves a batch.
    const int converted = layout.image_field >= 0 ? layout.image_field : layout.token_field;
    layout.staging_offset =
        RoundUp(layout.fields[converted].row_bytes * static_cast<size_t>(host.batch_size), 256);
    layout.convert_input_offset = layout.staging_offset + host.offsets[converted];
    for (size_t f = 0; f < host.fields.size(); ++f) {
      layout.offsets.push_back(
          static_cast<int>(f) == converted ? 0 : layout.staging_offset + host.offsets[f]);
    }
    offset = layout.staging_offset + host_bytes;
  } else {
    // Unconverted: identical to the host layout, so one copy moves a whole batch.
    layout.offsets = host.offsets;
    offset = host_bytes;
  }
  layout.slot_bytes = RoundUp(offset, kDeviceSlotAlignment);
  return layout;
}

}  // namespace ferry
