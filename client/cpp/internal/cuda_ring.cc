// CudaRing over the CUDA runtime, built from the owners of cuda/ (DeviceBuffer::OpenIpc,
// CudaEvent::OpenIpc), the library ferryd's GPU transport is built on too.
#include "client/cpp/internal/cuda_ring.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "cuda/cuda_resources.h"
#include "cuda/cuda_status.h"
#include "cuda/scoped_device.h"

namespace ferry {
namespace internal {
namespace {

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string VisibleDevicesNote() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return visible == nullptr ? std::string("CUDA_VISIBLE_DEVICES is unset")
                            : absl::StrCat("CUDA_VISIBLE_DEVICES=", visible);
}

absl::Status Check(cudaError_t error, const char* call, absl::string_view detail) {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return CudaStatus(error, call, detail);
}

// The local ordinal of the device at `pci_bus_id`.
absl::StatusOr<int> LocalDevice(const CudaRingSpec& spec) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "ferryd serves this job on GPU ", spec.pci_bus_id, " (its cuda:", spec.daemon_device,
        ") but this process has no usable CUDA device (",
        error == cudaSuccess ? "cudaGetDeviceCount: 0 devices"
                             : CudaStatus(error, "cudaGetDeviceCount").message(),
        "; ", VisibleDevicesNote(), ")"));
  }
  int device = -1;
  error = cudaDeviceGetByPCIBusId(&device, spec.pci_bus_id.c_str());
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("ferryd serves this job on GPU ", spec.pci_bus_id,
                     " (its cuda:", spec.daemon_device, "), which this process cannot see (",
                     CudaStatus(error, "cudaDeviceGetByPCIBusId", spec.pci_bus_id).message(), "; ",
                     VisibleDevicesNote(),
                     "); make that GPU visible to the trainer or create the "
                     "job on one it can see"));
  }
  return device;
}

class CudaRingImpl final : public CudaRing {
 public:
  static absl::StatusOr<std::shared_ptr<const CudaRing>> Open(const CudaRingSpec& spec) {
    if (spec.mem_handles.size() != spec.ready_events.size() ||
        spec.mem_handles.size() != spec.released_events.size() || spec.mem_handles.empty()) {
      return absl::InternalError(absl::StrCat(
          "ferryd sent ", spec.mem_handles.size(), " slot memory handles, ",
          spec.ready_events.size(), " ready events and ", spec.released_events.size(),
          " released events; expected the same non-zero number (a ferryd older than this "
          "client sends no released events: upgrade ferryd)"));
    }
    FERRY_ASSIGN_OR_RETURN(int device, LocalDevice(spec));
    auto ring = std::shared_ptr<CudaRingImpl>(new CudaRingImpl(spec, device));
    const size_t n = spec.mem_handles.size();
    ring->slots_.reserve(n);
    ring->ready_.reserve(n);
    ring->released_.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      if (spec.mem_handles[i].size() != kCudaIpcHandleSize ||
          spec.ready_events[i].size() != kCudaIpcHandleSize ||
          spec.released_events[i].size() != kCudaIpcHandleSize) {
        return absl::InternalError(
            absl::StrCat("ferryd sent IPC handles of ", spec.mem_handles[i].size(), ", ",
                         spec.ready_events[i].size(), " and ", spec.released_events[i].size(),
                         " bytes for slot ", i, "; expected ", kCudaIpcHandleSize));
      }
      MemIpcHandle mem;
      std::memcpy(mem.bytes.data(), spec.mem_handles[i].data(), kCudaIpcHandleSize);
      absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::OpenIpc(device, mem, spec.slot_bytes);
      if (!buffer.ok()) return IpcError(spec, i, "device slot", buffer.status());
      ring->slots_.push_back(*std::move(buffer));

      EventIpcHandle ready;
      std::memcpy(ready.bytes.data(), spec.ready_events[i].data(), kCudaIpcHandleSize);
      absl::StatusOr<CudaEvent> event = CudaEvent::OpenIpc(device, ready);
      if (!event.ok()) return IpcError(spec, i, "ready event", event.status());
      ring->ready_.push_back(*std::move(event));

      EventIpcHandle released;
      std::memcpy(released.bytes.data(), spec.released_events[i].data(), kCudaIpcHandleSize);
      absl::StatusOr<CudaEvent> released_event = CudaEvent::OpenIpc(device, released);
      if (!released_event.ok()) {
        return IpcError(spec, i, "released event", released_event.status());
      }
      ring->released_.push_back(*std::move(released_event));
    }
    return std::shared_ptr<const CudaRing>(std::move(ring));
  }

  int device() const override { return device_; }
  uint32_t num_slots() const override { return static_cast<uint32_t>(slots_.size()); }
  const uint8_t* slot_data(uint32_t slot) const override {
    return static_cast<const uint8_t*>(slots_[slot].data());
  }
  bool Matches(const CudaRingSpec& spec) const override {
    return spec.pci_bus_id == spec_.pci_bus_id && spec.slot_bytes == spec_.slot_bytes &&
           spec.mem_handles == spec_.mem_handles && spec.ready_events == spec_.ready_events &&
           spec.released_events == spec_.released_events;
  }

  absl::Status WaitReady(uint32_t slot, void* stream) const override {
    // A batch that is already in its slot (ferry ahead of the trainer, the usual case)
    // needs no stream wait; skipping it keeps the trainer's stream from stalling on an
    // interprocess event. The query sees ferryd's latest record, which is this batch's:
    // ferryd re-records a slot's ready event only after the trainer released it.
    const cudaError_t query = cudaEventQuery(ready_[slot].get());
    if (query == cudaSuccess) return absl::OkStatus();
    (void)cudaGetLastError();  // NotReady is no error; a real one the wait below reports
    auto* s = static_cast<cudaStream_t>(stream);
    if (s != nullptr) {
      return Check(cudaStreamWaitEvent(s, ready_[slot].get(), 0), "cudaStreamWaitEvent",
                   absl::StrCat("ready event of slot ", slot));
    }
    // The legacy default stream is the current device's: enter the ring's device.
    ScopedDevice scope(device_);
    FERRY_RETURN_IF_ERROR(scope.status());
    return Check(cudaStreamWaitEvent(s, ready_[slot].get(), 0), "cudaStreamWaitEvent",
                 absl::StrCat("ready event of slot ", slot, ", legacy default stream"));
  }

  absl::StatusOr<bool> SignalReleased(uint32_t slot, void* stream) const override {
    auto* s = static_cast<cudaStream_t>(stream);
    std::optional<ScopedDevice> scope;
    if (s == nullptr) {
      // The legacy default stream is the current device's: enter the ring's device.
      scope.emplace(device_);
      FERRY_RETURN_IF_ERROR(scope->status());
    }
    const cudaError_t query = cudaStreamQuery(s);
    if (query == cudaSuccess) return false;  // idle: every read of the slot is done
    if (query != cudaErrorNotReady) {
      return Check(query, "cudaStreamQuery", absl::StrCat("stream releasing slot ", slot));
    }
    (void)cudaGetLastError();
    FERRY_RETURN_IF_ERROR(Check(cudaEventRecord(released_[slot].get(), s), "cudaEventRecord",
                                absl::StrCat("released event of slot ", slot,
                                             s == nullptr ? ", legacy default stream" : "")));
    return true;
  }

 private:
  CudaRingImpl(const CudaRingSpec& spec, int device) : spec_(spec), device_(device) {}

  static absl::Status IpcError(const CudaRingSpec& spec, size_t slot, absl::string_view what,
                               const absl::Status& status) {
    return absl::Status(
        absl::IsResourceExhausted(status) ? status.code() : absl::StatusCode::kFailedPrecondition,
        absl::StrCat("cannot open ferryd's ", what, " of slot ", slot, " on GPU ", spec.pci_bus_id,
                     " over CUDA IPC: ", status.message(),
                     "; the trainer and ferryd must run on the same host in the same IPC "
                     "namespace (containers: --ipc=host or a shared IPC namespace)"));
  }

  // Constant after Open.
  const CudaRingSpec spec_;
  const int device_;
  std::vector<DeviceBuffer> slots_;
  std::vector<CudaEvent> ready_;
  std::vector<CudaEvent> released_;  // ferryd's, opened here: recorded by SignalReleased
};

}  // namespace

absl::StatusOr<std::shared_ptr<const CudaRing>> CudaRing::Open(const CudaRingSpec& spec) {
  return CudaRingImpl::Open(spec);
}

absl::StatusOr<std::string> CudaPciBusId(int ordinal) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda:", ordinal, ": no usable CUDA device in this process (",
        CudaStatus(error, "cudaGetDeviceCount").message(), "; ", VisibleDevicesNote(), ")"));
  }
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(absl::StrCat("cuda:", ordinal, ": this process sees ", count,
                                                   " CUDA device(s) (", VisibleDevicesNote(), ")"));
  }
  char bus_id[32] = {};
  FERRY_RETURN_IF_ERROR(Check(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), ordinal),
                              "cudaDeviceGetPCIBusId", absl::StrCat("cuda:", ordinal)));
  return Lower(bus_id);
}

bool BuiltWithCuda() { return true; }

}  // namespace internal
}  // namespace ferry
