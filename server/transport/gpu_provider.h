// What ferryd's control plane needs from the GPU transport, with no CUDA types, so the
// service builds (and serves the host transport) without a CUDA toolkit.
#ifndef FERRY_SERVER_TRANSPORT_GPU_PROVIDER_H_
#define FERRY_SERVER_TRANSPORT_GPU_PROVIDER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ferry/v1/ferry.pb.h"
#include "server/memory/shared_slab.h"
#include "server/pipeline/job.h"
#include "server/transport/device_stage.h"

namespace ferry {

class GpuProvider {
 public:
  virtual ~GpuProvider() = default;
  // "cuda:N" (ferryd's ordinal) or "cuda:<PCI bus id>" ("cuda:0000:3b:00.0") -> ordinal.
  // FAILED_PRECONDITION naming the GPUs ferryd sees when there is no such GPU.
  virtual absl::StatusOr<int> Resolve(const std::string& device) const = 0;
  // Checks what a job asks of the device side (image_output); INVALID_ARGUMENT naming the
  // field.
  virtual absl::Status CheckJob(const Job& job) const = 0;
  // OK when the GPU's device stages can decode JPEGs (nvJPEG loads); else why not, in words
  // for status ("GPU JPEG decode is off: ...").
  virtual absl::Status GpuDecodeAvailable() const {
    return absl::FailedPreconditionError("GPU JPEG decode is off: ferryd has no GPU decoder");
  }
  // NUMA node of the GPU (-1: no preference), for the slab and the workers.
  virtual int NumaNode(int ordinal) const = 0;
  // Registers `slab` as pinned memory and allocates the rank's device ring, within the
  // pinned and per-GPU device budgets (RESOURCE_EXHAUSTED naming them otherwise).
  virtual absl::StatusOr<std::unique_ptr<DeviceStage>> MakeStage(const Job& job, int ordinal,
                                                                 const SharedSlab& slab,
                                                                 int num_slots) = 0;
  virtual void FillStatus(ferry::v1::DaemonStatus* status) const = 0;
};

}  // namespace ferry

#endif  // FERRY_SERVER_TRANSPORT_GPU_PROVIDER_H_
