// Where each field lives in a CUDA device slot, given the host slot layout and what the job
// asks of the device side (image normalisation, token widening). Pure arithmetic: no CUDA.
//
//   FERRY_ASSIGN_OR_RETURN(DeviceSlotLayout layout,
//                          DeviceSlotLayout::Make(job.layout(), job.spec().image_output()));
//   ... DeviceBuffer::Create(device, layout.slot_bytes) per device slot ...
#ifndef FERRY_SERVER_GPU_DEVICE_SLOT_LAYOUT_H_
#define FERRY_SERVER_GPU_DEVICE_SLOT_LAYOUT_H_

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/v1/ferry.pb.h"
#include "server/dataset/sample_source.h"
#include "server/pipeline/job.h"

namespace ferry {

// Without conversion the device layout equals the host layout (one copy per batch). With
// one (images normalised to CHW floats, raw tokens widened to INT64 / INT32) the converted
// field comes first and a staging area after it receives the H2D copy of the host slot.
struct DeviceSlotLayout {
  std::vector<FieldLayout> fields;
  std::vector<size_t> offsets;
  size_t slot_bytes = 0;  // a multiple of 2 MiB (each slot is its own allocation)
  int image_field = -1;   // image field normalized on the device, -1 when none
  int token_field = -1;   // raw token field widened on the device, -1 when none
  // The internal field of photometric programs (kPhotometricField) that the image
  // conversion applies (LaunchPhotometric) instead of a plain normalisation; -1 when none.
  int program_field = -1;
  ferry::v1::DType token_input = ferry::v1::UINT16;  // its dtype on the host
  // The host layout's last field when it stays in the host slot (kGpuDecodeJpegField:
  // nvJPEG reads the routed JPEGs there): never copied, and the device slot ends before its
  // offset; -1 when none.
  int host_only_field = -1;
  // Converting: the host slot's bytes land at staging_offset (one copy per batch); the
  // converted field's input is at convert_input_offset, the other fields are read in place
  // (their offsets point into the staging area).
  size_t staging_offset = 0;
  size_t convert_input_offset = 0;
  ferry::v1::DType image_dtype = ferry::v1::UINT8;
  ferry::v1::DType token_dtype = ferry::v1::INT64;  // INT64 or INT32
  float mean[3] = {0, 0, 0};
  float std[3] = {1, 1, 1};

  bool converts() const { return image_field >= 0 || token_field >= 0; }

  // The device slot for host slots laid out as `host`. Images are normalized when `output`
  // asks for a float dtype; a field of raw tokens (FieldLayout::device_dtype set) is widened
  // to its device_dtype. INVALID_ARGUMENT naming image_output's field when it is not a valid
  // request.
  static absl::StatusOr<DeviceSlotLayout> Make(const SlotLayout& host,
                                               const ferry::v1::ImageOutput& output);
};

}  // namespace ferry

#endif  // FERRY_SERVER_GPU_DEVICE_SLOT_LAYOUT_H_
