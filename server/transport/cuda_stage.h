// The GPU transport (CUDA): per (job, rank) a ring of cudaMalloc'ed device slots on the
// rank's GPU, exported once with cudaIpcGetMemHandle, two interprocess events per slot
// ("ready", recorded here after the copy and any kernel; "released", recorded by the
// trainer and opened here when it binds), the job's host slab registered once as pinned
// memory, and one copy stream. Per batch, once the pipeline has seen released[d] complete:
// H2D (only uint8 crosses PCIe for images), optionally normalize to CHW floats, record
// ready[d]. Records may instead be gathered from the dataset's pinned page cache
// (GatherOptions below), on several streams in turn. The host never waits on the device
// except on a completion thread that returns host slots.
#ifndef FERRY_SERVER_TRANSPORT_CUDA_STAGE_H_
#define FERRY_SERVER_TRANSPORT_CUDA_STAGE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/memory/memory_budget.h"
#include "server/pipeline/device_stage.h"
#include "server/topology/topology.h"
#include "server/transport/gather_options.h"
#include "server/transport/gpu_provider.h"

namespace ferry {

// Where each field lives in a device slot. Without conversion the device layout equals the
// host layout (one copy per batch); with normalization the image field becomes CHW floats
// and a uint8 staging area at the end of the slot receives the H2D copy.
struct DeviceSlotLayout {
  std::vector<FieldLayout> fields;
  std::vector<size_t> offsets;
  size_t slot_bytes = 0;
  int image_field = -1;         // image field normalized on the device, -1 when none
  int token_field = -1;         // raw token field widened on the device, -1 when none
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
  // asks for a float dtype; a "tokens" field that the host holds raw (UINT16 / UINT32, see
  // TokenSource) is widened to `tokens_output` (INT64 when unspecified). INVALID_ARGUMENT
  // naming image_output's field when it is not a valid request.
  static absl::StatusOr<DeviceSlotLayout> Make(
      const SlotLayout& host, const ferry::v1::ImageOutput& output,
      ferry::v1::DType tokens_output = ferry::v1::DTYPE_UNSPECIFIED);
};

// Creates the CUDA GpuProvider: lists the GPUs (CUDA ordinals with their PCI bus ids and
// NUMA nodes from `topology`), with daemon-wide pinned and per-GPU device budgets. With no
// usable GPU it still answers, refusing cuda devices with the reason.
std::unique_ptr<GpuProvider> MakeCudaGpuProvider(const Topology& topology,
                                                 MemoryBudget* pinned_budget,
                                                 uint64_t device_budget_bytes,
                                                 const std::string& config_path,
                                                 GatherOptions gather = {});

}  // namespace ferry

#endif  // FERRY_SERVER_TRANSPORT_CUDA_STAGE_H_
