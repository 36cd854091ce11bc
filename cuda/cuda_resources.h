// Move-only owners of the CUDA resources the GPU transport is built from: streams, events
// (interprocess ones for the per-slot "ready" / "released" signals), device buffers (the
// device ring, exported over CUDA IPC), page-locked registrations of host memory (the job's
// slab), and a look at the machine's devices.
//
// Every owner is made by a static Create (or OpenIpc, for the trainer's side of an IPC
// handle) returning absl::StatusOr, remembers its device and enters it (ScopedDevice) around
// every call it makes, its release included, so it may be used and destroyed on any thread;
// it releases its resource in its destructor, which logs a failure and never
// throws. Errors read "<cudaCall>(<what>): <cudaErrorName> (<description>)"; out of memory
// is RESOURCE_EXHAUSTED (see cuda_status.h).
//
// This header does not include CUDA's: a stream or event handle is exposed as the pointer
// type that cudaStream_t / cudaEvent_t are typedefs of, so it passes to the runtime, and to
// ferry's launchers (which take void*), without casts.
//
//   FERRY_ASSIGN_OR_RETURN(CudaStream copy, CudaStream::Create(device));
//   FERRY_ASSIGN_OR_RETURN(DeviceBuffer ring, DeviceBuffer::Create(device, slots * bytes));
//   FERRY_ASSIGN_OR_RETURN(CudaEvent ready, CudaEvent::Create(device, CudaEvent::kInterprocess));
//   FERRY_ASSIGN_OR_RETURN(MemIpcHandle handle, ring.IpcHandle());  // once; sent to the trainer
//   FERRY_RETURN_IF_ERROR(copy.Wait(released));
//   FERRY_RETURN_IF_ERROR(copy.CopyAsync(ring.data(), slab_slot, bytes));
//   FERRY_RETURN_IF_ERROR(copy.Record(ready));
//
// Thread safety: the owners are not synchronised; using one owner from several threads
// needs external locking. Distinct owners may be used concurrently (the CUDA runtime is
// thread safe).
#ifndef FERRY_CUDA_CUDA_RESOURCES_H_
#define FERRY_CUDA_CUDA_RESOURCES_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// The CUDA runtime's handle types are pointers to these (cudaStream_t is CUstream_st*).
struct CUstream_st;
struct CUevent_st;

namespace ferry {

// CUDA_IPC_HANDLE_SIZE: the bytes of a cudaIpcMemHandle_t and of a cudaIpcEventHandle_t.
inline constexpr size_t kCudaIpcHandleSize = 64;

// An exported device allocation, as bytes that can travel to another process.
struct MemIpcHandle {
  std::array<uint8_t, kCudaIpcHandleSize> bytes{};
};
// An exported interprocess event.
struct EventIpcHandle {
  std::array<uint8_t, kCudaIpcHandleSize> bytes{};
};

// Number of CUDA devices this process can use. 0 when the driver reports none
// (cudaErrorNoDevice); FAILED_PRECONDITION naming the CUDA error when there is no usable
// driver (e.g. cudaErrorInsufficientDriver on a machine without one). The first call
// initialises the CUDA runtime: a process that will fork() must not call it before.
absl::StatusOr<int> DeviceCount();

struct DeviceInfo {
  int index = 0;
  std::string name;            // "NVIDIA H100 80GB HBM3"
  std::string pci_bus_id;      // "0000:3b:00.0", lower case as in /sys/bus/pci/devices
  size_t total_memory = 0;     // bytes
  int compute_capability = 0;  // major * 10 + minor: 90 for Hopper
  int multiprocessor_count = 0;
};

// INVALID_ARGUMENT for an index outside [0, DeviceCount()).
absl::StatusOr<DeviceInfo> GetDeviceInfo(int device);

class CudaEvent;

// A stream that does not synchronise with the legacy default stream (cudaStreamNonBlocking).
class CudaStream final {
 public:
  static absl::StatusOr<CudaStream> Create(int device);

  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream();

  CUstream_st* get() const { return stream_; }
  int device() const { return device_; }

  // Enqueues a copy of `bytes` from `src` to `dst`, each host or device memory (unified
  // addressing tells which). From registered or cudaHostAlloc'ed host memory the copy is
  // asynchronous DMA; from pageable memory the runtime stages it and returns when the
  // source may be reused.
  absl::Status CopyAsync(void* dst, const void* src, size_t bytes) const;
  // Records `event` after the work enqueued so far. The event must belong to this
  // stream's device.
  absl::Status Record(const CudaEvent& event) const;
  // Makes work enqueued later wait (on the device; the host does not block) until the most
  // recent record of `event`, as of this call, has completed. An event of another process
  // (CudaEvent::OpenIpc) is allowed.
  absl::Status Wait(const CudaEvent& event) const;
  // Blocks the calling thread until the stream's work is done.
  absl::Status Synchronize() const;

 private:
  CudaStream(CUstream_st* stream, int device) : stream_(stream), device_(device) {}
  void Release();

  CUstream_st* stream_ = nullptr;
  int device_ = 0;
};

class CudaEvent final {
 public:
  enum Kind {
    kTiming,        // can be passed to ElapsedMillis
    kSync,          // cudaEventDisableTiming: cheapest to record and wait on
    kInterprocess,  // cudaEventInterprocess | cudaEventDisableTiming: has an IpcHandle
  };
  static absl::StatusOr<CudaEvent> Create(int device, Kind kind);
  // Opens an interprocess event exported by another process, on `device` (the device the
  // exporter created it on, as this process numbers it). A handle of this same process is
  // rejected by CUDA (INVALID_ARGUMENT).
  static absl::StatusOr<CudaEvent> OpenIpc(int device, const EventIpcHandle& handle);

  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent();

  CUevent_st* get() const { return event_; }
  int device() const { return device_; }
  Kind kind() const { return kind_; }

  // FAILED_PRECONDITION unless created here with kInterprocess.
  absl::StatusOr<EventIpcHandle> IpcHandle() const;
  // Whether the most recent record has completed (true when never recorded).
  absl::StatusOr<bool> IsComplete() const;
  // Blocks the calling thread until the most recent record has completed.
  absl::Status Synchronize() const;

 private:
  CudaEvent(CUevent_st* event, int device, Kind kind, bool opened)
      : event_(event), device_(device), kind_(kind), opened_(opened) {}
  void Release();

  CUevent_st* event_ = nullptr;
  int device_ = 0;
  Kind kind_ = kSync;
  bool opened_ = false;  // from OpenIpc
};

// Milliseconds between two completed records of kTiming events.
absl::StatusOr<float> ElapsedMillis(const CudaEvent& start, const CudaEvent& end);

// Device memory: an allocation of this process (cudaMalloc, freed with cudaFree) or another
// process's allocation mapped through its IPC handle (closed with cudaIpcCloseMemHandle).
class DeviceBuffer final {
 public:
  // cudaMalloc: at least 256-byte aligned. RESOURCE_EXHAUSTED when the device is full.
  static absl::StatusOr<DeviceBuffer> Create(int device, size_t bytes);
  // Maps another process's allocation on `device`. `bytes` is what the exporter said the
  // allocation holds; CUDA does not check it. A handle of this same process is rejected.
  static absl::StatusOr<DeviceBuffer> OpenIpc(int device, const MemIpcHandle& handle, size_t bytes);

  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  int device() const { return device_; }
  bool is_ipc_mapping() const { return mapped_; }

  // The handle another process opens with OpenIpc. Export once per allocation: it stays
  // valid until this buffer is destroyed. FAILED_PRECONDITION for an IPC mapping.
  absl::StatusOr<MemIpcHandle> IpcHandle() const;

 private:
  DeviceBuffer(void* data, size_t size, int device, bool mapped)
      : data_(data), size_(size), device_(device), mapped_(mapped) {}
  void Release();

  void* data_ = nullptr;
  size_t size_ = 0;
  int device_ = 0;
  bool mapped_ = false;
};

// Page-locks an existing host range (cudaHostRegister, portable: pinned for every device),
// so copies from it are DMA at full PCIe speed; cudaHostUnregister on destruction. Both
// run with `device` current (the device that will copy from it), so registering for GPU 1
// never creates GPU 0's context. The
// range must stay mapped for the registration's lifetime. Registration costs time in
// proportion to the size (hundreds of ms per GiB): do it once per slab, never per batch.
//
// kReadOnly registers a range the process may only read (a PROT_READ file mapping: its
// page cache) with cudaHostRegisterReadOnly; devices then only read it too.
class HostRegistration final {
 public:
  enum class Access { kReadWrite, kReadOnly };

  // INVALID_ARGUMENT for a null or empty range; ALREADY_EXISTS when part of it is
  // registered already.
  static absl::StatusOr<HostRegistration> Create(int device, void* data, size_t bytes,
                                                 Access access = Access::kReadWrite);

  // The address kernels on `device` read the range at (cudaHostGetDevicePointer; the
  // host address itself on most systems).
  absl::StatusOr<const void*> DeviceData(int device) const;

  HostRegistration(HostRegistration&& other) noexcept;
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  ~HostRegistration();

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  HostRegistration(void* data, size_t size, int device)
      : data_(data), size_(size), device_(device) {}
  void Release();

  void* data_ = nullptr;
  size_t size_ = 0;
  int device_ = 0;
};

}  // namespace ferry

#endif  // FERRY_CUDA_CUDA_RESOURCES_H_
