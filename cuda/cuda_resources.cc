#include "cuda/cuda_resources.h"

#include <cuda_runtime_api.h>

#include <cctype>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "cuda/cuda_status.h"
#include "cuda/scoped_device.h"

namespace ferry {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleSize);
static_assert(sizeof(cudaIpcEventHandle_t) == kCudaIpcHandleSize);

// Destructors report failures and carry on. At process exit the runtime may already be
// unloaded; that is not worth a log line.
void LogIfFailed(cudaError_t error, const char* call, const std::string& detail) {
  if (error == cudaSuccess || error == cudaErrorCudartUnloading) return;
  FERRY_LOG(WARNING) << "releasing a CUDA resource: " << CudaStatus(error, call, detail);
}

// Every failing runtime call also sets the thread's "last error", which a later kernel
// launch check (cudaGetLastError) would report as its own. The call's status is returned
// here, so the stale copy is dropped.
absl::Status Check(cudaError_t error, const char* call, absl::string_view detail = {}) {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return CudaStatus(error, call, detail);
}

// Runs `call` (returning a cudaError_t) with `device` current, then puts the thread's
// previous context back; returns the error of entering the device when that fails.
template <typename Call>
cudaError_t OnDevice(int device, Call call) {
  ScopedDevice scope(device);
  return scope.status().ok() ? call() : scope.error();
}

}  // namespace

absl::StatusOr<int> DeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaErrorNoDevice) {
    (void)cudaGetLastError();
    return 0;
  }
  FERRY_RETURN_IF_ERROR(Check(error, "cudaGetDeviceCount"));
  return count;
}

absl::StatusOr<DeviceInfo> GetDeviceInfo(int device) {
  FERRY_ASSIGN_OR_RETURN(int count, DeviceCount());
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device,
                                                   " does not exist; this machine has ", count,
                                                   count == 1 ? " device (index 0)" : " devices"));
  }
  const std::string what = absl::StrCat("device ", device);
  DeviceInfo info;
  info.index = device;
  cudaDeviceProp prop;
  FERRY_RETURN_IF_ERROR(
      Check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties", what));
  info.name = prop.name;
  info.total_memory = prop.totalGlobalMem;
  info.compute_capability = prop.major * 10 + prop.minor;
  info.multiprocessor_count = prop.multiProcessorCount;
  char bus_id[32] = {};
  FERRY_RETURN_IF_ERROR(
      Check(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device), "cudaDeviceGetPCIBusId", what));
  info.pci_bus_id = bus_id;
  for (char& c : info.pci_bus_id)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return info;
}

// ---------------------------------------------------------------------------------- stream

absl::StatusOr<CudaStream> CudaStream::Create(int device) {
  ScopedDevice scope(device);
  FERRY_RETURN_IF_ERROR(scope.status());
  cudaStream_t stream = nullptr;
  FERRY_RETURN_IF_ERROR(Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                              "cudaStreamCreateWithFlags", absl::StrCat("device ", device)));
  return CudaStream(stream, device);
}

CudaStream::CudaStream(CudaStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    Release();
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

CudaStream::~CudaStream() { Release(); }

void CudaStream::Release() {
  if (stream_ == nullptr) return;
  // Work still queued completes; the stream's resources are freed after it.
  LogIfFailed(OnDevice(device_, [&] { return cudaStreamDestroy(stream_); }), "cudaStreamDestroy",
              absl::StrCat("device ", device_));
  stream_ = nullptr;
}

absl::Status CudaStream::CopyAsync(void* dst, const void* src, size_t bytes) const {
  if (bytes == 0) return absl::OkStatus();
  // Hot path (every batch): the error's detail is formatted only on failure.
  const cudaError_t error = OnDevice(
      device_, [&] { return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_); });
  if (error == cudaSuccess) return absl::OkStatus();
  return Check(error, "cudaMemcpyAsync", absl::StrCat(bytes, " bytes on device ", device_));
}

absl::Status CudaStream::Record(const CudaEvent& event) const {
  if (event.device() != device_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot record an event of device ", event.device(), " on a stream of device ", device_));
  }
  const cudaError_t error =
      OnDevice(device_, [&] { return cudaEventRecord(event.get(), stream_); });
  if (error == cudaSuccess) return absl::OkStatus();
  return Check(error, "cudaEventRecord", absl::StrCat("device ", device_));
}

absl::Status CudaStream::Wait(const CudaEvent& event) const {
  const cudaError_t error =
      OnDevice(device_, [&] { return cudaStreamWaitEvent(stream_, event.get(), 0); });
  if (error == cudaSuccess) return absl::OkStatus();
  return Check(error, "cudaStreamWaitEvent", absl::StrCat("device ", device_));
}

absl::Status CudaStream::Synchronize() const {
  return Check(OnDevice(device_, [&] { return cudaStreamSynchronize(stream_); }),
               "cudaStreamSynchronize", absl::StrCat("device ", device_));
}

// ----------------------------------------------------------------------------------- event

absl::StatusOr<CudaEvent> CudaEvent::Create(int device, Kind kind) {
  unsigned flags = cudaEventDefault;
  if (kind == kSync) flags = cudaEventDisableTiming;
  if (kind == kInterprocess) flags = cudaEventInterprocess | cudaEventDisableTiming;
  ScopedDevice scope(device);
  FERRY_RETURN_IF_ERROR(scope.status());
  cudaEvent_t event = nullptr;
  FERRY_RETURN_IF_ERROR(Check(cudaEventCreateWithFlags(&event, flags), "cudaEventCreateWithFlags",
                              absl::StrCat("device ", device)));
  return CudaEvent(event, device, kind, /*opened=*/false);
}

absl::StatusOr<CudaEvent> CudaEvent::OpenIpc(int device, const EventIpcHandle& handle) {
  ScopedDevice scope(device);
  FERRY_RETURN_IF_ERROR(scope.status());
  cudaIpcEventHandle_t native;
  std::memcpy(&native, handle.bytes.data(), sizeof(native));
  cudaEvent_t event = nullptr;
  FERRY_RETURN_IF_ERROR(Check(cudaIpcOpenEventHandle(&event, native), "cudaIpcOpenEventHandle",
                              absl::StrCat("device ", device)));
  return CudaEvent(event, device, kInterprocess, /*opened=*/true);
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)),
      device_(other.device_),
      kind_(other.kind_),
      opened_(other.opened_) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    Release();
    event_ = std::exchange(other.event_, nullptr);
    device_ = other.device_;
    kind_ = other.kind_;
    opened_ = other.opened_;
  }
  return *this;
}

CudaEvent::~CudaEvent() { Release(); }

void CudaEvent::Release() {
  if (event_ == nullptr) return;
  LogIfFailed(OnDevice(device_, [&] { return cudaEventDestroy(event_); }), "cudaEventDestroy",
              absl::StrCat("device ", device_));
  event_ = nullptr;
}

absl::StatusOr<EventIpcHandle> CudaEvent::IpcHandle() const {
  if (kind_ != kInterprocess || opened_) {
    return absl::FailedPreconditionError(
        opened_ ? "an event opened from an IPC handle cannot be exported again"
                : "only events created with CudaEvent::kInterprocess can be exported");
  }
  cudaIpcEventHandle_t native;
  FERRY_RETURN_IF_ERROR(
      Check(OnDevice(device_, [&] { return cudaIpcGetEventHandle(&native, event_); }),
            "cudaIpcGetEventHandle", absl::StrCat("device ", device_)));
  EventIpcHandle handle;
  std::memcpy(handle.bytes.data(), &native, sizeof(native));
  return handle;
}

absl::StatusOr<bool> CudaEvent::IsComplete() const {
  const cudaError_t error = OnDevice(device_, [&] { return cudaEventQuery(event_); });
  if (error == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  if (error == cudaSuccess) return true;
  return Check(error, "cudaEventQuery", absl::StrCat("device ", device_));
}

absl::Status CudaEvent::Synchronize() const {
  return Check(OnDevice(device_, [&] { return cudaEventSynchronize(event_); }),
               "cudaEventSynchronize", absl::StrCat("device ", device_));
}

absl::StatusOr<float> ElapsedMillis(const CudaEvent& start, const CudaEvent& end) {
  if (start.kind() != CudaEvent::kTiming || end.kind() != CudaEvent::kTiming) {
    return absl::FailedPreconditionError("ElapsedMillis needs two CudaEvent::kTiming events");
  }
  float ms = 0;
  FERRY_RETURN_IF_ERROR(Check(
      OnDevice(start.device(), [&] { return cudaEventElapsedTime(&ms, start.get(), end.get()); }),
      "cudaEventElapsedTime"));
  return ms;
}

// ---------------------------------------------------------------------------------- buffer

absl::StatusOr<DeviceBuffer> DeviceBuffer::Create(int device, size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("device buffer of 0 bytes");
  ScopedDevice scope(device);
  FERRY_RETURN_IF_ERROR(scope.status());
  void* data = nullptr;
  FERRY_RETURN_IF_ERROR(Check(cudaMalloc(&data, bytes), "cudaMalloc",
                              absl::StrCat(bytes, " bytes on device ", device)));
  return DeviceBuffer(data, bytes, device, /*mapped=*/false);
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::OpenIpc(int device, const MemIpcHandle& handle,
                                                   size_t bytes) {
  ScopedDevice scope(device);
  FERRY_RETURN_IF_ERROR(scope.status());
  cudaIpcMemHandle_t native;
  std::memcpy(&native, handle.bytes.data(), sizeof(native));
  void* data = nullptr;
  FERRY_RETURN_IF_ERROR(Check(cudaIpcOpenMemHandle(&data, native, cudaIpcMemLazyEnablePeerAccess),
                              "cudaIpcOpenMemHandle", absl::StrCat("device ", device)));
  return DeviceBuffer(data, bytes, device, /*mapped=*/true);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      device_(other.device_),
      mapped_(other.mapped_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = other.device_;
    mapped_ = other.mapped_;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { Release(); }

void DeviceBuffer::Release() {
  if (data_ == nullptr) return;
  const std::string what = absl::StrCat(size_, " bytes on device ", device_);
  // cudaFree may synchronise the current device: make it this buffer's.
  ScopedDevice scope(device_);
  if (!scope.status().ok()) {
    LogIfFailed(scope.error(), "cudaSetDevice", what);  // the driver reclaims it at exit
  } else if (mapped_) {
    LogIfFailed(cudaIpcCloseMemHandle(data_), "cudaIpcCloseMemHandle", what);
  } else {
    LogIfFailed(cudaFree(data_), "cudaFree", what);
  }
  data_ = nullptr;
  size_ = 0;
}

absl::StatusOr<MemIpcHandle> DeviceBuffer::IpcHandle() const {
  if (mapped_) {
    return absl::FailedPreconditionError(
        "a device buffer opened from an IPC handle cannot be exported again");
  }
  cudaIpcMemHandle_t native;
  FERRY_RETURN_IF_ERROR(
      Check(OnDevice(device_, [&] { return cudaIpcGetMemHandle(&native, data_); }),
            "cudaIpcGetMemHandle", absl::StrCat(size_, " bytes on device ", device_)));
  MemIpcHandle handle;
  std::memcpy(handle.bytes.data(), &native, sizeof(native));
  return handle;
}

// ---------------------------------------------------------------------------- registration

absl::StatusOr<HostRegistration> HostRegistration::Create(int device, void* data, size_t bytes,
                                                          Access access) {
  if (data == nullptr || bytes == 0) {
    return absl::InvalidArgumentError("cannot page-lock an empty host range");
  }
  unsigned flags = cudaHostRegisterPortable;
  if (access == Access::kReadOnly) flags |= cudaHostRegisterMapped | cudaHostRegisterReadOnly;
  FERRY_RETURN_IF_ERROR(Check(
      OnDevice(device, [&] { return cudaHostRegister(data, bytes, flags); }), "cudaHostRegister",
      absl::StrCat(bytes, " bytes", access == Access::kReadOnly ? ", read-only" : "")));
  return HostRegistration(data, bytes, device);
}

absl::StatusOr<const void*> HostRegistration::DeviceData(int device) const {
  ScopedDevice scope(device);
  FERRY_RETURN_IF_ERROR(scope.status());
  void* mapped = nullptr;
  FERRY_RETURN_IF_ERROR(Check(cudaHostGetDevicePointer(&mapped, data_, 0),
                              "cudaHostGetDevicePointer", absl::StrCat("device ", device)));
  return static_cast<const void*>(mapped);
}

HostRegistration::HostRegistration(HostRegistration&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      device_(other.device_) {}

HostRegistration& HostRegistration::operator=(HostRegistration&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = other.device_;
  }
  return *this;
}

HostRegistration::~HostRegistration() { Release(); }

void HostRegistration::Release() {
  if (data_ == nullptr) return;
  LogIfFailed(OnDevice(device_, [&] { return cudaHostUnregister(data_); }), "cudaHostUnregister",
              absl::StrCat(size_, " bytes"));
  data_ = nullptr;
  size_ = 0;
}

}  // namespace ferry
