#include "server/gpu/cuda_stage.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "cuda/scoped_device.h"

namespace ferry {
namespace {

OutputDType ToOutputDType(ferry::v1::DType dtype) {
  switch (dtype) {
    case ferry::v1::FLOAT16:
      return OutputDType::kFloat16;
    case ferry::v1::BFLOAT16:
      return OutputDType::kBFloat16;
    default:
      return OutputDType::kFloat32;
  }
}

// What the watcher polls for a CUDA event. `event` outlives the watch (the stage owns both).
EventWatcher::CompletionQuery IsComplete(const CudaEvent& event) {
  return [&event] { return event.IsComplete(); };
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaStage>> CudaStage::Create(
    int device, std::string pci_bus_id, const Job& job, const SharedSlab& slab, int num_slots,
    MemoryBudget* pinned_budget, MemoryBudget* device_budget, std::shared_ptr<GpuCounters> counters,
    PinnedMappings* mappings, const GatherOptions& gather) {
  // Every call below runs on this stage's device, whichever device the calling thread (a
  // gRPC handler) last touched; each owner also enters its own device.
  ScopedDevice scope(device);
  FERRY_RETURN_IF_ERROR(scope.status());
  std::unique_ptr<CudaStage> stage(new CudaStage());
  stage->counters_ = std::move(counters);
  stage->device_ = device;
  stage->pci_bus_id_ = std::move(pci_bus_id);
  stage->host_ = &job.layout();
  stage->slab_ = slab.data();
  FERRY_ASSIGN_OR_RETURN(stage->layout_,
                         DeviceSlotLayout::Make(job.layout(), job.spec().image_output()));
  const std::string what = absl::StrCat("job ", job.identity().id);
  FERRY_ASSIGN_OR_RETURN(stage->pinned_, pinned_budget->Reserve(slab.size(), what));
  FERRY_ASSIGN_OR_RETURN(stage->device_bytes_,
                         device_budget->Reserve(stage->layout_.slot_bytes * num_slots, what));
  // Registered once: every batch of this rank is copied from these pages.
  FERRY_ASSIGN_OR_RETURN(stage->registration_,
                         HostRegistration::Create(device, slab.data(), slab.size()));
  FERRY_ASSIGN_OR_RETURN(stage->stream_, CudaStream::Create(device));
  for (int i = 0; i < num_slots; ++i) {
    FERRY_ASSIGN_OR_RETURN(DeviceBuffer buffer,
                           DeviceBuffer::Create(device, stage->layout_.slot_bytes));
    FERRY_ASSIGN_OR_RETURN(MemIpcHandle mem, buffer.IpcHandle());
    FERRY_ASSIGN_OR_RETURN(CudaEvent ready, CudaEvent::Create(device, CudaEvent::kInterprocess));
    FERRY_ASSIGN_OR_RETURN(EventIpcHandle event, ready.IpcHandle());
    FERRY_ASSIGN_OR_RETURN(CudaEvent released, CudaEvent::Create(device, CudaEvent::kInterprocess));
    FERRY_ASSIGN_OR_RETURN(EventIpcHandle released_handle, released.IpcHandle());
    stage->slots_.push_back(std::move(buffer));
    stage->ready_.push_back(std::move(ready));
    stage->released_.push_back(std::move(released));
    stage->mem_handles_.push_back(mem);
    stage->ready_handles_.push_back(event);
    stage->released_handles_.push_back(released_handle);
  }
  // Per host slot an event that frees it before the normalize kernel has run (images).
  const int host_slots =
      stage->layout_.image_field >= 0 ? static_cast<int>(slab.size() / job.layout().slot_bytes) : 0;
  for (int i = 0; i < host_slots; ++i) {
    FERRY_ASSIGN_OR_RETURN(CudaEvent done, CudaEvent::Create(device, CudaEvent::kSync));
    stage->copy_done_.push_back(std::move(done));
  }
  stage->slot_stream_.assign(stage->slots_.size(), -1);
  FERRY_ASSIGN_OR_RETURN(
      stage->jpeg_,
      GpuJpegStage::Create(device, job, slab.data(), stage->layout_, num_slots, stage->counters_));
  // Registration, stream, per slot a buffer and ready and released events, maybe per host
  // slot an event. A consumer adds none (it records the exported events).
  stage->objects_created_ = 2 + 3 * stage->slots_.size() + stage->copy_done_.size();
  stage->ChooseCopyPath(job, mappings, gather);
  stage->watcher_ = std::make_unique<EventWatcher>(
      stage->counters_, absl::StrCat("job ", job.identity().id, " on GPU ", device));
  stage->counted_pinned_ = slab.size();
  stage->counters_->pinned_bytes.fetch_add(slab.size(), std::memory_order_relaxed);
  stage->counters_->stages.fetch_add(1, std::memory_order_relaxed);
  return stage;
}

CudaStage::~CudaStage() {
  // The last reference may go on any thread (a handler, a worker, the watcher itself).
  ScopedDevice scope(device_);
  // The watcher must stop before the events and the callbacks go away.
  watcher_.reset();
  auto drain = [this](CudaStream& stream) {
    absl::Status s = stream.Synchronize();
    if (!s.ok()) FERRY_LOG(WARNING) << "copy stream of GPU " << device_ << ": " << s;
  };
  if (stream_.has_value()) drain(*stream_);
  for (CudaStream& stream : more_gather_streams_) drain(stream);
  if (counted_pinned_ != 0) {
    counters_->pinned_bytes.fetch_sub(counted_pinned_, std::memory_order_relaxed);
    counters_->stages.fetch_sub(1, std::memory_order_relaxed);
  }
}

bool CudaStage::gather_ready() const {
  if (const int state = gather_state_.load(std::memory_order_acquire); state != kRegistering) {
    return state == kReady;
  }
  absl::MutexLock lock(&gather_mutex_);
  if (const int state = gather_state_.load(std::memory_order_relaxed); state != kRegistering) {
    return state == kReady;  // resolved by another caller meanwhile
  }
  absl::StatusOr<const PinnedRange*> registration = gather_lease_->registration();
  if (absl::IsUnavailable(registration.status())) return false;  // still registering
  absl::StatusOr<const void*> mapped =
      registration.ok() ? (*registration)->DeviceData(device_) : registration.status();
  if (!mapped.ok()) {
    gather_note_ = absl::StrCat("workers copy the records: ", mapped.status().message());
    FERRY_LOG(WARNING) << "job " << job_id_ << " on GPU " << device_ << ": " << gather_note_;
    gather_state_.store(kFailed, std::memory_order_release);
    return false;
  }
  gather_source_ = GatherSource{.records = static_cast<const uint8_t*>(*mapped) +
                                           (gather_rows_.records - gather_rows_.mapping),
                                .num_records = gather_rows_.num_records,
                                .row_bytes = gather_rows_.row_bytes};
  gather_state_.store(kReady, std::memory_order_release);
  return true;
}

absl::Status CudaStage::StartCopy(int host_slot, int device_slot, uint32_t num_samples, bool gather,
                                  uint64_t token) {
  const absl::Time start = absl::Now();
  absl::Status s = gather && gather_state_.load(std::memory_order_acquire) != kReady
                       ? absl::InternalError(
                             "StartCopy asked to gather rows whose page "
                             "cache is not registered")
                       : EnqueueCopy(host_slot, device_slot, num_samples, gather, token);
  enqueue_nanos_.fetch_add(absl::ToInt64Nanoseconds(absl::Now() - start),
                           std::memory_order_relaxed);
  return s;
}

void CudaStage::WatchReleased(int device_slot, uint64_t token) {
  if (device_slot >= static_cast<int>(released_.size())) return;
  watcher_->Watch(
      IsComplete(released_[device_slot]), EventWatcher::kReleased,
      [this, device_slot, token] { callbacks_.device_slot_released(device_slot, token); });
}

bool CudaStage::ReleasedSignalPending(int device_slot) const {
  if (device_slot >= static_cast<int>(released_.size())) return false;
  absl::StatusOr<bool> complete = released_[device_slot].IsComplete();
  // An error (a dead trainer's event) is reported by the watcher; the slot is no work.
  return complete.ok() && !*complete;
}

absl::Status CudaStage::EnqueueCopy(int host_slot, int device_slot, uint32_t num_samples,
                                    bool gather, uint64_t token) {
  ScopedDevice scope(device_);
  FERRY_RETURN_IF_ERROR(scope.status());
  FERRY_ASSIGN_OR_RETURN(CudaStream * stream, TakeStream(device_slot, gather));
  const uint8_t* src = slab_ + static_cast<size_t>(host_slot) * host_->slot_bytes;
  uint8_t* dst = static_cast<uint8_t*>(slots_[device_slot].data());
  FERRY_RETURN_IF_ERROR(gather ? EnqueueGather(*stream, src, dst, num_samples)
                               : EnqueueSlotCopy(*stream, src, dst, num_samples));
  // nvJPEG reads the routed JPEGs from the host slot: it stays busy until they are decoded.
  if (jpeg_ != nullptr) {
    FERRY_RETURN_IF_ERROR(jpeg_->Enqueue(*stream, host_slot, src, dst, device_slot, num_samples));
  }
  // Images: the host slot is free once the bytes crossed PCIe, before the normalize
  // kernel (long) has read them from device memory. Otherwise the ready event marks both.
  const bool own_copy_event = layout_.image_field >= 0;
  if (own_copy_event) FERRY_RETURN_IF_ERROR(stream->Record(copy_done_[host_slot]));
  FERRY_RETURN_IF_ERROR(EnqueueConversion(*stream, dst, num_samples));
  FERRY_RETURN_IF_ERROR(stream->Record(ready_[device_slot]));
  counters_->in_flight.fetch_add(1, std::memory_order_relaxed);
  WatchCopy(host_slot, device_slot, token, own_copy_event);
  counters_->bytes_to_device.fetch_add(host_->slot_bytes, std::memory_order_relaxed);
  bytes_copied_.fetch_add(host_->slot_bytes, std::memory_order_relaxed);
  batches_copied_.fetch_add(1, std::memory_order_relaxed);
  if (gather) batches_gathered_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::StatusOr<CudaStream*> CudaStage::TakeStream(int device_slot, bool gather) {
  // Gathers take the copy stream and the extra gather streams in turn, so that a batch's
  // kernel starts while the ones before drain (on one stream, each kernel's ramp and
  // tail idle PCIe; GatherOptions). The watcher only reports a batch after those before
  // it: the order seen by the ring stays the order of these calls.
  const int turn =
      gather ? static_cast<int>(gathers_enqueued_++ % (1 + more_gather_streams_.size())) : 0;
  CudaStream& stream = turn == 0 ? *stream_ : more_gather_streams_[turn - 1];
  // A device slot is written only once its last batch is released, which orders the two
  // writes, but for a batch abandoned by a seek (DeviceRing::DropQueued frees its slot
  // while its copy may still be queued): on another stream, that copy could land after this
  // one. So a slot written before on another stream waits for that write's ready event
  // first (long complete, but for an abandoned batch).
  if (slot_stream_[device_slot] >= 0 && slot_stream_[device_slot] != turn) {
    FERRY_RETURN_IF_ERROR(stream.Wait(ready_[device_slot]));
  }
  slot_stream_[device_slot] = turn;
  return &stream;
}

absl::Status CudaStage::EnqueueGather(CudaStream& stream, const uint8_t* src, uint8_t* dst,
                                      uint32_t num_samples) {
  // The gathered field's rows come from the page cache, located by the indices the
  // workers wrote. Up to kMaxGatherRowsPerLaunch rows, the indices travel in the kernel's
  // launch parameters and the kernel writes the index field too: no copy precedes it.
  // Larger batches copy the indices first. Other fields are copied.
  const bool params = num_samples <= kMaxGatherRowsPerLaunch;
  for (size_t f = 0; f < host_->fields.size(); ++f) {
    const int field = static_cast<int>(f);
    if (field == gathered_field_ || (params && field == index_field_)) continue;
    FERRY_RETURN_IF_ERROR(stream.CopyAsync(dst + layout_.offsets[f], src + host_->offsets[f],
                                           host_->fields[f].row_bytes * num_samples));
  }
  auto* device_indices = reinterpret_cast<int64_t*>(dst + layout_.offsets[index_field_]);
  uint8_t* rows = dst + layout_.offsets[gathered_field_];
  if (params) {
    const auto* host_indices = reinterpret_cast<const int64_t*>(src + host_->offsets[index_field_]);
    return LaunchGatherRowsIndexedFromHost(gather_source_,
                                           absl::MakeConstSpan(host_indices, num_samples), rows,
                                           device_indices, gather_blocks_, stream.get());
  }
  return LaunchGatherRows(gather_source_, device_indices, num_samples, rows, gather_blocks_,
                          stream.get());
}

absl::Status CudaStage::EnqueueSlotCopy(CudaStream& stream, const uint8_t* src, uint8_t* dst,
                                        uint32_t num_samples) {
  // One copy of the rows in use, into the slot itself or (converting) its staging area. The
  // routed JPEGs (the last field) stay in the host slot, where nvJPEG reads them.
  size_t used = 0;
  for (size_t f = 0; f < host_->fields.size(); ++f) {
    if (static_cast<int>(f) == layout_.host_only_field) continue;
    used = std::max(used, host_->offsets[f] + host_->fields[f].row_bytes * num_samples);
  }
  return stream.CopyAsync(layout_.converts() ? dst + layout_.staging_offset : dst, src, used);
}

absl::Status CudaStage::EnqueueConversion(CudaStream& stream, uint8_t* dst, uint32_t num_samples) {
  if (layout_.image_field >= 0) {
    const FieldLayout& image = host_->fields[layout_.image_field];
    if (layout_.program_field >= 0) {
      // The ops a composed transform left to the device, then its Normalize.
      return LaunchPhotometric(
          dst + layout_.convert_input_offset,
          reinterpret_cast<const PhotometricProgram*>(dst + layout_.offsets[layout_.program_field]),
          dst + layout_.offsets[layout_.image_field], ToOutputDType(layout_.image_dtype),
          static_cast<int>(num_samples), static_cast<int>(image.shape[0]),
          static_cast<int>(image.shape[1]), stream.get());
    }
    return LaunchNormalizeImages(dst + layout_.convert_input_offset,
                                 dst + layout_.offsets[layout_.image_field],
                                 ToOutputDType(layout_.image_dtype), static_cast<int>(num_samples),
                                 static_cast<int>(image.shape[0]), static_cast<int>(image.shape[1]),
                                 layout_.mean, layout_.std, stream.get());
  }
  if (layout_.token_field >= 0) {
    // Raw tokens: only 2 or 4 bytes per token crossed PCIe; widen them here.
    const FieldLayout& tokens = host_->fields[layout_.token_field];
    const TokenInput input = layout_.token_input == ferry::v1::UINT16   ? TokenInput::kUint16
                             : layout_.token_input == ferry::v1::UINT32 ? TokenInput::kUint32
                                                                        : TokenInput::kInt32;
    return LaunchWidenTokens(
        dst + layout_.convert_input_offset, input, dst + layout_.offsets[layout_.token_field],
        layout_.token_dtype == ferry::v1::INT32 ? TokenOutput::kInt32 : TokenOutput::kInt64,
        static_cast<int64_t>(tokens.shape[0]) * num_samples, stream.get());
  }
  return absl::OkStatus();
}

void CudaStage::WatchCopy(int host_slot, int device_slot, uint64_t token, bool own_copy_event) {
  if (own_copy_event) {
    watcher_->Watch(IsComplete(copy_done_[host_slot]), EventWatcher::kHostSlotCopied,
                    [this, host_slot] { callbacks_.host_slot_free(host_slot); });
    watcher_->Watch(
        IsComplete(ready_[device_slot]), EventWatcher::kDeviceSlotReady,
        [this, device_slot, token] { callbacks_.device_slot_ready(device_slot, token); });
  } else {
    watcher_->Watch(
        IsComplete(ready_[device_slot]), EventWatcher::kDeviceSlotReady,
        [this, host_slot, device_slot, token] {
          // host_slot_free may drop the last reference to this stage (its pipeline's):
          // nothing of `this` is read after it.
          const std::function<void(int, uint64_t)> ready = callbacks_.device_slot_ready;
          callbacks_.host_slot_free(host_slot);
          ready(device_slot, token);
        },
        /*also_frees_host_slot=*/true);
  }
}

void CudaStage::Describe(ferry::v1::AttachResponse* response) const {
  response->set_slot_bytes(layout_.slot_bytes);
  ferry::v1::CudaTransport* cuda = response->mutable_cuda();
  cuda->set_device(device_);
  cuda->set_pci_bus_id(pci_bus_id_);
  cuda->set_slot_bytes(layout_.slot_bytes);
  for (size_t i = 0; i < slots_.size(); ++i) {
    ferry::v1::CudaSlot* slot = cuda->add_slots();
    slot->set_mem_handle(mem_handles_[i].bytes.data(), mem_handles_[i].bytes.size());
    slot->set_ready_event(ready_handles_[i].bytes.data(), ready_handles_[i].bytes.size());
    slot->set_released_event(released_handles_[i].bytes.data(), released_handles_[i].bytes.size());
  }
  for (size_t f = 0; f < layout_.fields.size(); ++f) {
    if (layout_.fields[f].internal) continue;
    ferry::v1::Field* field = cuda->add_fields();
    field->set_name(layout_.fields[f].name);
    field->set_dtype(layout_.fields[f].dtype);
    for (int64_t d : layout_.fields[f].shape) field->add_shape(d);
    field->set_offset(layout_.offsets[f]);
    field->set_row_bytes(layout_.fields[f].row_bytes);
  }
}

absl::Status CudaStage::OpenConsumer(const std::vector<std::string>& released_events) {
  if (!released_events.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Open carries ", released_events.size(),
        " released events, but this ferryd exports "
        "its own (CudaSlot.released_event); the trainer's ferry client library is older "
        "than ferryd: upgrade it"));
  }
  return absl::OkStatus();  // the consumer records the events Describe exported
}

void CudaStage::CloseConsumer() {
  // The events stay: the next consumer of the rank records them anew before any watch.
  watcher_->Forget(EventWatcher::kReleased);
}

void CudaStage::FillStatus(ferry::v1::RankStatus* status) const {
  status->set_device_bytes(device_bytes_.bytes());
  status->set_pinned_bytes(pinned_.bytes());
  status->set_bytes_to_device(bytes_copied_.load(std::memory_order_relaxed));
  status->set_cuda_objects_created(objects_created_);
  status->set_copy_enqueue_seconds(enqueue_nanos_.load(std::memory_order_relaxed) * 1e-9);
  status->set_copy_complete_seconds(watcher_->seconds(EventWatcher::kHostSlotCopied));
  status->set_copy_ready_seconds(watcher_->seconds(EventWatcher::kDeviceSlotReady));
  status->set_release_signal_seconds(watcher_->seconds(EventWatcher::kReleased));
  status->set_batches_copied(batches_copied_.load(std::memory_order_relaxed));
  status->set_batches_gathered(batches_gathered_.load(std::memory_order_relaxed));
  if (jpeg_ != nullptr) status->set_gpu_decode_demand(jpeg_->demand());
  if (gathered_field_ < 0) {
    status->set_copy_path(ferry::v1::SLOT_COPY);
    status->set_copy_path_note(copy_path_note_);
  } else if (gather_ready()) {
    status->set_copy_path(ferry::v1::PAGE_CACHE_GATHER);
    status->set_copy_path_note(gather_every_batch_
                                   ? ""
                                   : "kernels gather the batches made while the trainer waits for "
                                     "them; workers copy the rows of those made while it computes");
  } else {
    absl::MutexLock lock(&gather_mutex_);
    const bool failed = gather_state_.load(std::memory_order_relaxed) == kFailed;
    status->set_copy_path(failed ? ferry::v1::SLOT_COPY : ferry::v1::PAGE_CACHE_GATHER);
    status->set_copy_path_note(
        failed ? gather_note_
               : "registering the dataset's page cache (reading the file in); workers copy "
                 "the rows until it is done");
  }
  status->set_pinned_dataset_bytes(gather_lease_.has_value() ? gather_lease_->bytes() : 0);
}

void CudaStage::ChooseCopyPath(const Job& job, PinnedMappings* mappings,
                               const GatherOptions& gather) {
  const std::optional<DirectRows> rows = job.source().direct_rows();
  if (!rows.has_value() || layout_.converts()) return;  // nothing to gather
  if (!gather.enabled) {
    copy_path_note_ = "page-cache gather is off (disable_page_cache_gather)";
    return;
  }
  absl::StatusOr<PinnedMappings::Lease> lease =
      mappings->Acquire(*rows, device_, gather.registration_wait);
  absl::Status status = lease.status();
  std::vector<CudaStream> streams;
  for (int i = 1; status.ok() && i < std::max(1, gather.streams); ++i) {
    absl::StatusOr<CudaStream> stream = CudaStream::Create(device_);
    status = stream.status();
    if (stream.ok()) streams.push_back(*std::move(stream));
  }
  if (!status.ok()) {
    copy_path_note_ = absl::StrCat("workers copy the records: ", status.message());
    FERRY_LOG(WARNING) << "job " << job.identity().id << " on GPU " << device_ << ": "
                       << copy_path_note_;
    return;
  }
  more_gather_streams_ = std::move(streams);
  gather_lease_.emplace(*std::move(lease));
  gathered_field_ = rows->field;
  index_field_ = rows->index_field;
  gather_blocks_ = std::max(1, gather.thread_blocks);
  gather_every_batch_ = gather.every_batch;
  gather_rows_ = *rows;
  job_id_ = job.identity().id;
  gather_state_.store(kRegistering, std::memory_order_relaxed);
  objects_created_ += 1 + more_gather_streams_.size();  // the lease, the extra streams
  gather_ready();
}

}  // namespace ferry
