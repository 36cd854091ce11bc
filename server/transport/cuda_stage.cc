#include "server/transport/cuda_stage.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <sys/prctl.h>
#include <unistd.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "common/status_macros.h"
#include "cuda/cuda_resources.h"
#include "cuda/scoped_device.h"
#include "server/kernels/normalize.h"

namespace ferry {
namespace {

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Device slots are separate cudaMalloc allocations; 2 MiB keeps each one on its own large
// pages and its IPC mapping aligned.
constexpr size_t kDeviceSlotAlignment = 2 << 20;

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

// Per-GPU totals over every stage on that GPU, for status. Shared by the provider and its
// stages (a stage may outlive neither, but shared ownership keeps that a non-question).
struct GpuCounters {
  std::atomic<uint64_t> pinned_bytes{0};
  std::atomic<uint64_t> bytes_to_device{0};
  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> stages{0};
};

// Watches CUDA events from one thread of its own and runs a callback once each has
// completed: the host side of "ready" and "released" (device_stage.h says why the host,
// not the GPU, waits for the other process). It polls with cudaEventQuery, backing off
// from 5 us to 100 us while nothing completes, and sleeps on a condition when nothing is
// watched. Callbacks run without its lock held.
//
// A callback may drop the last reference to the pipeline that owns this watcher, so the
// destructor can run on the watcher's own thread. The thread's state therefore lives in a
// shared State that the thread co-owns: such a destructor detaches instead of joining, and
// the thread runs no further callback and returns.
class EventWatcher final {
 public:
  // What a watch is for; each has its own latency total, for status.
  enum Kind { kHostSlotCopied, kDeviceSlotReady, kReleased, kNumKinds };

  explicit EventWatcher(std::shared_ptr<GpuCounters> counters)
      : state_(std::make_shared<State>()) {
    state_->counters = std::move(counters);
    thread_ = std::thread([state = state_] { Run(*state); });
  }
  ~EventWatcher() {
    {
      absl::MutexLock lock(&state_->mutex);
      state_->stopping = true;
      for (const Item& item : state_->items) {  // copies nobody waits for any more
        if (item.kind == kDeviceSlotReady) {
          state_->counters->in_flight.fetch_sub(1, std::memory_order_relaxed);
        }
      }
      state_->items.clear();
    }
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // inside one of our callbacks: Run returns right after it
    } else {
      thread_.join();
    }
  }

  // `event` must stay alive until its callback has run or Forget(kind) returned. Events of
  // kHostSlotCopied and kDeviceSlotReady must be watched in the order they were recorded
  // (see Run; with the gather's several streams, a batch that completes before one
  // recorded ahead of it on another stream is reported just after that one).
  // `also_frees_host_slot`: a kDeviceSlotReady watch that stands for kHostSlotCopied too
  // (its latency counts for both).
  void Watch(const CudaEvent* event, Kind kind, std::function<void()> callback,
             bool also_frees_host_slot = false) {
    const absl::Time now = absl::Now();
    absl::MutexLock lock(&state_->mutex);
    state_->items.push_back({event, kind, std::move(callback), now, also_frees_host_slot});
  }
  // Drops every watch of `kind`; none of their callbacks starts after this returns.
  void Forget(Kind kind) {
    absl::MutexLock lock(&state_->mutex);
    std::erase_if(state_->items, [kind](const Item& item) { return item.kind == kind; });
  }
  // Total seconds from Watch to the callback, over every completed watch of `kind`.
  double seconds(Kind kind) const {
    absl::MutexLock lock(&state_->mutex);
    return state_->seconds[kind];
  }

 private:
  struct Item {
    const CudaEvent* event;
    Kind kind;
    std::function<void()> callback;
    absl::Time since;
    bool also_frees_host_slot;
  };
  struct State {
    std::shared_ptr<GpuCounters> counters;
    absl::Mutex mutex;
    std::vector<Item> items ABSL_GUARDED_BY(mutex);
    double seconds[kNumKinds] ABSL_GUARDED_BY(mutex) = {};
    bool stopping ABSL_GUARDED_BY(mutex) = false;
  };

  static bool Stopping(State& state) {
    absl::MutexLock lock(&state.mutex);
    return state.stopping;
  }

  static void Run(State& state) {
    NameThisThread("ferry-events");
    // Sleeps of a few microseconds need the kernel's timer slack (50 us by default) cut.
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    absl::Duration backoff = kMinBackoff;
    std::vector<std::function<void()>> done;
    for (;;) {
      {
        absl::MutexLock lock(&state.mutex);
        auto work = [&state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mutex) {
          return state.stopping || !state.items.empty();
        };
        state.mutex.Await(absl::Condition(&work));
        if (state.stopping) return;
        const absl::Time now = absl::Now();
        // The copy stream's events complete in the order they were recorded, which is the
        // order they were watched (nearly so with several gather streams): after the first one
        // still pending, none of the others is queried (each query takes the driver's
        // locks that the copy enqueue needs too).
        bool stream_pending = false;
        // Queried under the lock: Forget may destroy the events right after it returns.
        std::erase_if(state.items, [&](Item& item) {
          const bool in_stream_order = item.kind != kReleased;
          if (in_stream_order && stream_pending) return false;
          absl::StatusOr<bool> complete = item.event->IsComplete();
          if (complete.ok() && !*complete && in_stream_order) stream_pending = true;
          if (!complete.ok()) {
            // A dead trainer's event, or a device error: the copy stream reports the
            // latter on its next call; never leave a slot stuck.
            FERRY_LOG(WARNING) << "event watch: " << complete.status();
          } else if (!*complete) {
            return false;
          }
          const double seconds = absl::ToDoubleSeconds(now - item.since);
          state.seconds[item.kind] += seconds;
          if (item.also_frees_host_slot) state.seconds[kHostSlotCopied] += seconds;
          if (item.kind == kDeviceSlotReady) {
            state.counters->in_flight.fetch_sub(1, std::memory_order_relaxed);
          }
          done.push_back(std::move(item.callback));
          return true;
        });
      }
      const bool progressed = !done.empty();
      for (auto& callback : done) {
        if (Stopping(state)) return;  // the owner is gone (maybe destroyed by a callback)
        callback();
      }
      done.clear();
      if (progressed) {
        backoff = kMinBackoff;
      } else {
        absl::SleepFor(backoff);
        backoff = std::min(backoff * 2, kMaxBackoff);
      }
    }
  }

  static constexpr absl::Duration kMinBackoff = absl::Microseconds(5);
  static constexpr absl::Duration kMaxBackoff = absl::Microseconds(100);
  std::shared_ptr<State> state_;
  std::thread thread_;
};

// Dataset mappings registered read-only for the gather, one registration per mapping
// however many ranks read it (registering a range twice fails), each counted once against
// the pinned budget. cudaHostRegister reads the whole file in, at the disk's speed when it
// is not cached, so each registration runs on a thread of its own: Acquire reserves the
// budget and waits for it at most `wait`, and a Lease tells whether it is done. A Lease
// keeps its mapping registered; the last one to go unregisters it (after the registering
// thread is done), under the registry's lock, so a new Acquire never races a registration
// going away.
class PinnedMappings final {
 private:
  struct Entry {
    int users = 0;
    absl::Mutex mutex;
    // Given back when the registration fails: nothing stays pinned then.
    MemoryBudget::Reservation reservation ABSL_GUARDED_BY(mutex);
    bool done ABSL_GUARDED_BY(mutex) = false;
    absl::StatusOr<HostRegistration> registration ABSL_GUARDED_BY(mutex) =
        absl::UnavailableError("registering");
    std::thread registrar;  // joined by ~Entry: the registration outlives no thread
    ~Entry() {
      if (registrar.joinable()) registrar.join();
    }
  };

 public:
  class Lease final {
   public:
    Lease(Lease&& other) noexcept
        : owner_(std::exchange(other.owner_, nullptr)),
          key_(other.key_),
          entry_(other.entry_) {}
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    ~Lease() {
      if (owner_ != nullptr) owner_->Release(key_);
    }
    uint64_t bytes() const {
      absl::MutexLock lock(&entry_->mutex);
      return entry_->reservation.bytes();
    }
    // Not done yet: UNAVAILABLE. Done: the registration (kept until the last Lease goes),
    // or why it failed.
    absl::StatusOr<const HostRegistration*> registration() const {
      absl::MutexLock lock(&entry_->mutex);
      if (!entry_->done) return absl::UnavailableError("still registering");
      if (!entry_->registration.ok()) return entry_->registration.status();
      return &*entry_->registration;
    }

   private:
    friend class PinnedMappings;
    Lease(PinnedMappings* owner, const void* key, Entry* entry)
        : owner_(owner), key_(key), entry_(entry) {}
    PinnedMappings* owner_;
    const void* key_;
    Entry* entry_;  // owned by the registry
  };

  explicit PinnedMappings(MemoryBudget* budget) : budget_(budget) {}
  PinnedMappings(const PinnedMappings&) = delete;
  PinnedMappings& operator=(const PinnedMappings&) = delete;

  // RESOURCE_EXHAUSTED (the pinned budget, naming the file) at once; the registration's
  // outcome through the Lease, after waiting for it up to `wait`.
  absl::StatusOr<Lease> Acquire(const DirectRows& rows, int device, absl::Duration wait) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const uint64_t bytes = RoundUp(rows.mapping_bytes, page);  // the mapping's whole pages
    Entry* entry;
    {
      absl::MutexLock lock(&mutex_);
      std::unique_ptr<Entry>& slot = entries_[rows.mapping];
      if (slot == nullptr) {
        absl::StatusOr<MemoryBudget::Reservation> reservation =
            budget_->Reserve(bytes, absl::StrCat("the pinned page cache of '", rows.path, "'"));
        if (!reservation.ok()) {
          entries_.erase(rows.mapping);
          return reservation.status();
        }
        slot = std::make_unique<Entry>();
        Entry* e = slot.get();
        {
          absl::MutexLock entry_lock(&e->mutex);
          e->reservation = *std::move(reservation);
        }
        uint8_t* data = const_cast<uint8_t*>(rows.mapping);
        e->registrar = std::thread([e, data, bytes, device] {
          NameThisThread("ferry-register");
          cuda_internal::ScopedDevice scope(device);
          absl::StatusOr<HostRegistration> r =
              scope.status().ok()
                  ? HostRegistration::Create(data, bytes, HostRegistration::Access::kReadOnly)
                  : absl::StatusOr<HostRegistration>(scope.status());
          absl::MutexLock lock(&e->mutex);
          if (!r.ok()) e->reservation = MemoryBudget::Reservation();
          e->registration = std::move(r);
          e->done = true;
        });
      }
      entry = slot.get();
      ++entry->users;
    }
    Lease lease(this, rows.mapping, entry);
    absl::MutexLock lock(&entry->mutex);
    entry->mutex.AwaitWithTimeout(absl::Condition(&entry->done), wait);
    return lease;
  }

 private:
  void Release(const void* key) {
    absl::MutexLock lock(&mutex_);
    auto it = entries_.find(key);
    if (it != entries_.end() && --it->second->users == 0) entries_.erase(it);
  }

  MemoryBudget* const budget_;
  absl::Mutex mutex_;
  absl::flat_hash_map<const void*, std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mutex_);
};

class CudaStage final : public DeviceStage {
 public:
  static absl::StatusOr<std::unique_ptr<CudaStage>> Create(
      int device, std::string pci_bus_id, const Job& job, const SharedSlab& slab, int num_slots,
      MemoryBudget* pinned_budget, MemoryBudget* device_budget,
      std::shared_ptr<GpuCounters> counters, PinnedMappings* mappings,
      const GatherOptions& gather) {
    std::unique_ptr<CudaStage> stage(new CudaStage());
    stage->counters_ = std::move(counters);
    stage->device_ = device;
    stage->pci_bus_id_ = std::move(pci_bus_id);
    stage->host_ = &job.layout();
    stage->slab_ = slab.data();
    FERRY_ASSIGN_OR_RETURN(stage->layout_,
                           DeviceSlotLayout::Make(job.layout(), job.spec().image_output(),
                                                  job.spec().dataset().tokens().output_dtype()));
    const std::string what = absl::StrCat("job ", job.identity().id);
    FERRY_ASSIGN_OR_RETURN(stage->pinned_, pinned_budget->Reserve(slab.size(), what));
    FERRY_ASSIGN_OR_RETURN(stage->device_bytes_,
                           device_budget->Reserve(stage->layout_.slot_bytes * num_slots, what));
    // Registered once: every batch of this rank is copied from these pages.
    FERRY_ASSIGN_OR_RETURN(stage->registration_, HostRegistration::Create(slab.data(), slab.size()));
    FERRY_ASSIGN_OR_RETURN(stage->stream_, CudaStream::Create(device));
    for (int i = 0; i < num_slots; ++i) {
      FERRY_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Create(device, stage->layout_.slot_bytes));
      FERRY_ASSIGN_OR_RETURN(MemIpcHandle mem, buffer.IpcHandle());
      FERRY_ASSIGN_OR_RETURN(CudaEvent ready, CudaEvent::Create(device, CudaEvent::kInterprocess));
      FERRY_ASSIGN_OR_RETURN(EventIpcHandle event, ready.IpcHandle());
      FERRY_ASSIGN_OR_RETURN(CudaEvent released,
                             CudaEvent::Create(device, CudaEvent::kInterprocess));
      FERRY_ASSIGN_OR_RETURN(EventIpcHandle released_handle, released.IpcHandle());
      stage->slots_.push_back(std::move(buffer));
      stage->ready_.push_back(std::move(ready));
      stage->released_.push_back(std::move(released));
      stage->mem_handles_.push_back(mem);
      stage->ready_handles_.push_back(event);
      stage->released_handles_.push_back(released_handle);
    }
    // Per host slot an event that frees it before the normalize kernel has run (images).
    const int host_slots = stage->layout_.image_field >= 0
                               ? static_cast<int>(slab.size() / job.layout().slot_bytes)
                               : 0;
    for (int i = 0; i < host_slots; ++i) {
      FERRY_ASSIGN_OR_RETURN(CudaEvent done, CudaEvent::Create(device, CudaEvent::kSync));
      stage->copy_done_.push_back(std::move(done));
    }
    stage->slot_stream_.assign(stage->slots_.size(), -1);
    // Registration, stream, per slot a buffer and ready and released events, maybe per host
    // slot an event. A consumer adds none (it records the exported events).
    stage->objects_created_ = 2 + 3 * stage->slots_.size() + stage->copy_done_.size();
    stage->ChooseCopyPath(job, mappings, gather);
    stage->watcher_ = std::make_unique<EventWatcher>(stage->counters_);
    stage->counted_pinned_ = slab.size();
    stage->counters_->pinned_bytes.fetch_add(slab.size(), std::memory_order_relaxed);
    stage->counters_->stages.fetch_add(1, std::memory_order_relaxed);
    return stage;
  }

  ~CudaStage() override {
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

  int num_device_slots() const override { return static_cast<int>(slots_.size()); }
  int gathered_field() const override { return gathered_field_; }
  bool gathers_every_batch() const override { return gather_every_batch_; }
  // True once the dataset's registration is done and its device address known; from then
  // on gather_source_ is set and constant. A failed registration leaves the rank on the
  // workers' copy for good, with the reason in status and the log.
  bool gather_ready() const override {
    if (const int state = gather_state_.load(std::memory_order_acquire); state != kRegistering) {
      return state == kReady;
    }
    absl::MutexLock lock(&gather_mutex_);
    if (const int state = gather_state_.load(std::memory_order_relaxed); state != kRegistering) {
      return state == kReady;  // resolved by another caller meanwhile
    }
    absl::StatusOr<const HostRegistration*> registration = gather_lease_->registration();
    if (absl::IsUnavailable(registration.status())) return false;  // still registering
    absl::StatusOr<const void*> mapped =
        registration.ok() ? (*registration)->DeviceData(device_) : registration.status();
    if (!mapped.ok()) {
      gather_note_ = absl::StrCat("workers copy the records: ", mapped.status().message());
      FERRY_LOG(WARNING) << "job " << job_id_ << " on GPU " << device_ << ": " << gather_note_;
      gather_state_.store(kFailed, std::memory_order_release);
      return false;
    }
    gather_source_ = GatherSource{
        .records = static_cast<const uint8_t*>(*mapped) +
                   (gather_rows_.records - gather_rows_.mapping),
        .num_records = gather_rows_.num_records,
        .row_bytes = gather_rows_.row_bytes};
    gather_state_.store(kReady, std::memory_order_release);
    return true;
  }

  void SetCallbacks(Callbacks callbacks) override { callbacks_ = std::move(callbacks); }

  absl::Status StartCopy(int host_slot, int device_slot, uint32_t num_samples, bool gather,
                         uint64_t token) override {
    const absl::Time start = absl::Now();
    absl::Status s = gather && gather_state_.load(std::memory_order_acquire) != kReady
                         ? absl::InternalError("StartCopy asked to gather rows whose page "
                                               "cache is not registered")
                         : EnqueueCopy(host_slot, device_slot, num_samples, gather, token);
    enqueue_nanos_.fetch_add(absl::ToInt64Nanoseconds(absl::Now() - start),
                             std::memory_order_relaxed);
    return s;
  }

  void WatchReleased(int device_slot, uint64_t token) override {
    if (device_slot >= static_cast<int>(released_.size())) return;
    watcher_->Watch(&released_[device_slot], EventWatcher::kReleased, [this, device_slot, token] {
      callbacks_.device_slot_released(device_slot, token);
    });
  }

  bool ReleasedSignalPending(int device_slot) const override {
    if (device_slot >= static_cast<int>(released_.size())) return false;
    absl::StatusOr<bool> complete = released_[device_slot].IsComplete();
    // An error (a dead trainer's event) is reported by the watcher; the slot is no work.
    return complete.ok() && !*complete;
  }

  // The device slot is free (the pipeline saw its released signal complete), so the copy
  // stream never waits for the trainer's context.
  absl::Status EnqueueCopy(int host_slot, int device_slot, uint32_t num_samples, bool gather,
                           uint64_t token) {
    cuda_internal::ScopedDevice scope(device_);
    FERRY_RETURN_IF_ERROR(scope.status());
    // Gathers take the copy stream and the extra gather streams in turn, so that a batch's
    // kernel starts while the ones before drain (on one stream, each kernel's ramp and
    // tail idle PCIe; GatherOptions). The watcher only reports a batch after those before
    // it: the order seen by the pipeline stays the order of these calls.
    const int turn =
        gather ? static_cast<int>(gathers_enqueued_++ % (1 + more_gather_streams_.size())) : 0;
    CudaStream& stream = turn == 0 ? *stream_ : more_gather_streams_[turn - 1];
    // A device slot is written only once its last batch is released, which orders the two
    // writes, but for a batch abandoned by a seek (RankPipeline::StartEpoch frees its slot
    // while its copy may still be queued): on another stream, that copy could land after
    // this one. So a slot written before on another stream waits for that write's ready
    // event first (long complete, but for an abandoned batch).
    if (slot_stream_[device_slot] >= 0 && slot_stream_[device_slot] != turn) {
      FERRY_RETURN_IF_ERROR(stream.Wait(ready_[device_slot]));
    }
    slot_stream_[device_slot] = turn;
    const uint8_t* src = slab_ + static_cast<size_t>(host_slot) * host_->slot_bytes;
    uint8_t* dst = static_cast<uint8_t*>(slots_[device_slot].data());
    if (gather) {
      // The gathered field's rows come from the page cache, located by the indices the
      // workers wrote. Up to kMaxGatherRowsPerLaunch rows, the indices travel in the
      // kernel's launch parameters and the kernel writes the index field too: no copy
      // precedes it. Larger batches copy the indices first. Other fields are copied.
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
        const auto* host_indices =
            reinterpret_cast<const int64_t*>(src + host_->offsets[index_field_]);
        FERRY_RETURN_IF_ERROR(LaunchGatherRowsIndexedFromHost(
            gather_source_, absl::MakeConstSpan(host_indices, num_samples), rows, device_indices,
            gather_blocks_, stream.get()));
      } else {
        FERRY_RETURN_IF_ERROR(LaunchGatherRows(gather_source_, device_indices, num_samples, rows,
                                               gather_blocks_, stream.get()));
      }
    } else {
      // One copy of the rows in use, into the slot itself or (converting) its staging area.
      size_t used = 0;
      for (size_t f = 0; f < host_->fields.size(); ++f) {
        used = std::max(used, host_->offsets[f] + host_->fields[f].row_bytes * num_samples);
      }
      FERRY_RETURN_IF_ERROR(
          stream.CopyAsync(layout_.converts() ? dst + layout_.staging_offset : dst, src, used));
    }
    // Images: the host slot is free once the bytes crossed PCIe, before the normalize
    // kernel (long) has read them from device memory. Otherwise the ready event marks both.
    const bool own_copy_event = layout_.image_field >= 0;
    if (own_copy_event) FERRY_RETURN_IF_ERROR(stream.Record(copy_done_[host_slot]));
    if (layout_.image_field >= 0) {
      const FieldLayout& image = host_->fields[layout_.image_field];
      FERRY_RETURN_IF_ERROR(LaunchNormalizeImages(
          dst + layout_.convert_input_offset, dst + layout_.offsets[layout_.image_field],
          ToOutputDType(layout_.image_dtype), static_cast<int>(num_samples),
          static_cast<int>(image.shape[0]), static_cast<int>(image.shape[1]), layout_.mean,
          layout_.std, stream.get()));
    } else if (layout_.token_field >= 0) {
      // Raw tokens: only 2 or 4 bytes per token crossed PCIe; widen them here.
      const FieldLayout& tokens = host_->fields[layout_.token_field];
      FERRY_RETURN_IF_ERROR(LaunchWidenTokens(
          dst + layout_.convert_input_offset,
          tokens.dtype == ferry::v1::UINT16 ? TokenInput::kUint16 : TokenInput::kUint32,
          dst + layout_.offsets[layout_.token_field],
          layout_.token_dtype == ferry::v1::INT32 ? TokenOutput::kInt32 : TokenOutput::kInt64,
          static_cast<int64_t>(tokens.shape[0]) * num_samples, stream.get()));
    }
    FERRY_RETURN_IF_ERROR(stream.Record(ready_[device_slot]));
    counters_->in_flight.fetch_add(1, std::memory_order_relaxed);
    if (own_copy_event) {
      watcher_->Watch(&copy_done_[host_slot], EventWatcher::kHostSlotCopied,
                      [this, host_slot] { callbacks_.host_slot_free(host_slot); });
      watcher_->Watch(&ready_[device_slot], EventWatcher::kDeviceSlotReady,
                      [this, device_slot, token] {
                        callbacks_.device_slot_ready(device_slot, token);
                      });
    } else {
      watcher_->Watch(&ready_[device_slot], EventWatcher::kDeviceSlotReady,
                      [this, host_slot, device_slot, token] {
                        callbacks_.host_slot_free(host_slot);
                        callbacks_.device_slot_ready(device_slot, token);
                      },
                      /*also_frees_host_slot=*/true);
    }
    counters_->bytes_to_device.fetch_add(host_->slot_bytes, std::memory_order_relaxed);
    bytes_copied_.fetch_add(host_->slot_bytes, std::memory_order_relaxed);
    batches_copied_.fetch_add(1, std::memory_order_relaxed);
    if (gather) batches_gathered_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  void Describe(ferry::v1::AttachResponse* response) const override {
    ferry::v1::CudaTransport* cuda = response->mutable_cuda();
    cuda->set_device(device_);
    cuda->set_pci_bus_id(pci_bus_id_);
    cuda->set_slot_bytes(layout_.slot_bytes);
    for (size_t i = 0; i < slots_.size(); ++i) {
      ferry::v1::CudaSlot* slot = cuda->add_slots();
      slot->set_mem_handle(mem_handles_[i].bytes.data(), mem_handles_[i].bytes.size());
      slot->set_ready_event(ready_handles_[i].bytes.data(), ready_handles_[i].bytes.size());
      slot->set_released_event(released_handles_[i].bytes.data(),
                               released_handles_[i].bytes.size());
    }
    for (size_t f = 0; f < layout_.fields.size(); ++f) {
      ferry::v1::Field* field = cuda->add_fields();
      field->set_name(layout_.fields[f].name);
      field->set_dtype(layout_.fields[f].dtype);
      for (int64_t d : layout_.fields[f].shape) field->add_shape(d);
      field->set_offset(layout_.offsets[f]);
      field->set_row_bytes(layout_.fields[f].row_bytes);
    }
  }

  absl::Status OpenConsumer(const std::vector<std::string>& released_events) override {
    if (!released_events.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Open carries ", released_events.size(), " released events, but this ferryd exports "
          "its own (CudaSlot.released_event); the trainer's ferry client library is older "
          "than ferryd: upgrade it"));
    }
    return absl::OkStatus();  // the consumer records the events Describe exported
  }

  void CloseConsumer() override {
    // The events stay: the next consumer of the rank records them anew before any watch.
    watcher_->Forget(EventWatcher::kReleased);
  }

  void FillStatus(ferry::v1::RankStatus* status) const override {
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
    if (gathered_field_ < 0) {
      status->set_copy_path(ferry::v1::SLOT_COPY);
      status->set_copy_path_note(copy_path_note_);
    } else if (gather_ready()) {
      status->set_copy_path(ferry::v1::PAGE_CACHE_GATHER);
      status->set_copy_path_note(
          gather_every_batch_ ? ""
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

 private:
  CudaStage() = default;

  // Gathers the source's direct rows from its pinned page cache when it has them, nothing
  // converts them, the daemon allows it, and the file fits the pinned budget; otherwise
  // workers copy them, and copy_path_note_ says why (for status, and logged). The
  // registration may still be running when this returns (gather_ready).
  void ChooseCopyPath(const Job& job, PinnedMappings* mappings, const GatherOptions& gather) {
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

  // Set in Create, before any other thread can see the stage, and only read after: no lock
  // guards them (the annotated state is below).
  int device_ = 0;
  std::string pci_bus_id_;
  const SlotLayout* host_ = nullptr;  // owned by the Job, which outlives the pipeline
  const uint8_t* slab_ = nullptr;
  DeviceSlotLayout layout_;
  MemoryBudget::Reservation pinned_;
  MemoryBudget::Reservation device_bytes_;
  std::optional<HostRegistration> registration_;
  std::optional<CudaStream> stream_;
  std::vector<DeviceBuffer> slots_;
  std::vector<CudaEvent> ready_;
  std::vector<MemIpcHandle> mem_handles_;
  std::vector<EventIpcHandle> ready_handles_;
  // Per device slot, exported: every consumer of the rank records them (CudaSlot). Made in
  // Create, read-only after (WatchReleased, ReleasedSignalPending, Describe).
  std::vector<CudaEvent> released_;
  std::vector<EventIpcHandle> released_handles_;
  std::vector<CudaEvent> copy_done_;  // per host slot
  // Written by StartCopy, read by FillStatus (see device_stage.h: they may overlap).
  std::atomic<uint64_t> bytes_copied_{0};
  std::atomic<uint64_t> batches_copied_{0};
  std::atomic<uint64_t> batches_gathered_{0};
  std::atomic<int64_t> enqueue_nanos_{0};
  uint64_t objects_created_ = 0;
  Callbacks callbacks_;
  std::shared_ptr<GpuCounters> counters_;
  size_t counted_pinned_ = 0;  // what this stage added to counters_->pinned_bytes
  // Page-cache gather (ChooseCopyPath): constant after Create, but for the registration's
  // outcome (gather_ready).
  std::optional<PinnedMappings::Lease> gather_lease_;
  std::vector<CudaStream> more_gather_streams_;  // besides stream_
  uint64_t gathers_enqueued_ = 0;  // StartCopy runs on one thread at a time
  // Per device slot, the stream (0: stream_, i: more_gather_streams_[i - 1]) of its last
  // write, -1 before the first; StartCopy's thread only.
  std::vector<int> slot_stream_;
  bool gather_every_batch_ = true;
  int gathered_field_ = -1;
  int index_field_ = -1;
  int gather_blocks_ = 0;
  DirectRows gather_rows_;
  std::string job_id_;
  enum GatherState { kNone, kRegistering, kReady, kFailed };
  mutable std::atomic<int> gather_state_{kNone};
  mutable absl::Mutex gather_mutex_;  // resolves the registration's outcome once
  // Set once, under gather_mutex_, before gather_state_ becomes kReady; read after seeing it.
  mutable GatherSource gather_source_;
  mutable std::string gather_note_ ABSL_GUARDED_BY(gather_mutex_);  // why it failed
  std::string copy_path_note_;  // why a gatherable dataset is not gathered (constant)
  std::unique_ptr<EventWatcher> watcher_;  // last: destroyed first
};

struct Gpu {
  int ordinal = 0;
  std::string name;
  std::string pci_bus_id;
  int numa_node = -1;
  std::vector<int> worker_cpus;
  std::unique_ptr<MemoryBudget> device_budget;
  std::shared_ptr<GpuCounters> counters = std::make_shared<GpuCounters>();
};

class CudaGpuProvider final : public GpuProvider {
 public:
  CudaGpuProvider(const Topology& topology, MemoryBudget* pinned, uint64_t device_budget_bytes,
                  const std::string& config_path, GatherOptions gather)
      : pinned_(pinned), mappings_(pinned), gather_(gather) {
    auto count = DeviceCount();
    if (!count.ok()) {
      unavailable_ = std::string(count.status().message());
      return;
    }
    for (int i = 0; i < *count; ++i) {
      auto info = GetDeviceInfo(i);
      if (!info.ok()) continue;
      Gpu gpu;
      gpu.ordinal = i;
      gpu.name = info->name;
      gpu.pci_bus_id = info->pci_bus_id;
      gpu.numa_node = topology.NumaNodeOfPciDevice(info->pci_bus_id);
      // The worker pool runs a GPU's jobs on its node's group (all CPUs without a node).
      gpu.worker_cpus =
          gpu.numa_node >= 0 ? topology.CpusForNode(gpu.numa_node) : topology.AllCpus();
      const uint64_t budget = device_budget_bytes != 0 ? device_budget_bytes : info->total_memory / 4;
      gpu.device_budget = std::make_unique<MemoryBudget>(
          absl::StrCat("device memory budget of GPU ", i), "device_memory_budget_bytes", budget,
          config_path);
      gpus_.push_back(std::move(gpu));
    }
    if (gpus_.empty() && unavailable_.empty()) unavailable_ = "the CUDA runtime reports no GPU";
  }

  absl::StatusOr<int> Resolve(const std::string& device) const override {
    std::string rest = device.substr(std::min<size_t>(device.size(), 5));  // after "cuda:"
    const Gpu* found = nullptr;
    int ordinal;
    if (absl::SimpleAtoi(rest, &ordinal)) {
      for (const Gpu& g : gpus_) {
        if (g.ordinal == ordinal) found = &g;
      }
    } else {
      std::string want = absl::AsciiStrToLower(rest);
      if (want.size() == 7 && want[2] == ':') want = "0000:" + want;  // "3b:00.0" form
      for (const Gpu& g : gpus_) {
        if (g.pci_bus_id == want) found = &g;
      }
    }
    if (found != nullptr) return found->ordinal;
    return absl::FailedPreconditionError(absl::StrCat(
        "device '", device, "' is not a GPU this ferryd can use; it sees ", Describe(),
        ". Use device=\"cuda:N\" with one of those ordinals (or its PCI bus id), or \"cpu\""));
  }

  absl::Status CheckJob(const Job& job) const override {
    return DeviceSlotLayout::Make(job.layout(), job.spec().image_output(),
                                                  job.spec().dataset().tokens().output_dtype()).status();
  }

  int NumaNode(int ordinal) const override { return gpus_.at(ordinal).numa_node; }

  absl::StatusOr<std::unique_ptr<DeviceStage>> MakeStage(const Job& job, int ordinal,
                                                         const SharedSlab& slab,
                                                         int num_slots) override {
    const Gpu& gpu = gpus_.at(ordinal);
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<CudaStage> stage,
                           CudaStage::Create(ordinal, gpu.pci_bus_id, job, slab, num_slots,
                                             pinned_, gpu.device_budget.get(), gpu.counters,
                                             &mappings_, gather_));
    return std::unique_ptr<DeviceStage>(std::move(stage));
  }

  void FillStatus(ferry::v1::DaemonStatus* status) const override {
    status->set_cuda_available(!gpus_.empty());
    status->set_pinned_memory_in_use_bytes(pinned_->in_use());
    status->set_pinned_memory_budget_bytes(pinned_->limit());
    for (const Gpu& g : gpus_) {
      ferry::v1::GpuStatus* s = status->add_gpus();
      s->set_ordinal(g.ordinal);
      s->set_name(g.name);
      s->set_pci_bus_id(g.pci_bus_id);
      s->set_numa_node(g.numa_node);
      s->set_device_memory_in_use_bytes(g.device_budget->in_use());
      s->set_device_memory_budget_bytes(g.device_budget->limit());
      for (int cpu : g.worker_cpus) s->add_local_cpus(cpu);
      const GpuCounters& c = *g.counters;
      s->set_pinned_memory_in_use_bytes(c.pinned_bytes.load(std::memory_order_relaxed));
      const uint64_t bytes = c.bytes_to_device.load(std::memory_order_relaxed);
      s->set_bytes_to_device(bytes);
      s->set_h2d_bytes_per_second(rates_.Rate(g.ordinal, bytes));
      s->set_batches_in_flight(static_cast<uint32_t>(
          std::max<int64_t>(0, c.in_flight.load(std::memory_order_relaxed))));
      s->set_ranks(static_cast<uint32_t>(c.stages.load(std::memory_order_relaxed)));
    }
  }

 private:
  std::string Describe() const {
    if (gpus_.empty()) return absl::StrCat("no GPU (", unavailable_, ")");
    std::vector<std::string> parts;
    for (const Gpu& g : gpus_) {
      parts.push_back(absl::StrCat("cuda:", g.ordinal, " = ", g.name, " at ", g.pci_bus_id));
    }
    return absl::StrJoin(parts, ", ");
  }

  // H2D rate per GPU from the byte counter: the change since the oldest sample of the last
  // ~10 s (samples are taken when status is read), or since ferryd started.
  class RateTracker {
   public:
    double Rate(int ordinal, uint64_t bytes) {
      absl::MutexLock lock(&mutex_);
      const absl::Time now = absl::Now();
      std::deque<Sample>& samples = samples_[ordinal];
      if (samples.empty()) samples.push_back({start_, 0});
      while (samples.size() > 1 && now - samples[1].time >= absl::Seconds(1) &&
             now - samples.front().time > absl::Seconds(10)) {
        samples.pop_front();
      }
      const Sample& then = samples.front();
      const double seconds = absl::ToDoubleSeconds(now - then.time);
      const double rate = seconds > 0 ? static_cast<double>(bytes - then.bytes) / seconds : 0;
      // At most two samples a second: about 20 held per GPU.
      if (now - samples.back().time >= absl::Milliseconds(500)) samples.push_back({now, bytes});
      return rate;
    }

   private:
    struct Sample {
      absl::Time time;
      uint64_t bytes;
    };
    absl::Mutex mutex_;
    const absl::Time start_ = absl::Now();
    absl::flat_hash_map<int, std::deque<Sample>> samples_ ABSL_GUARDED_BY(mutex_);
  };

  MemoryBudget* const pinned_;
  PinnedMappings mappings_;
  const GatherOptions gather_;
  std::vector<Gpu> gpus_;
  std::string unavailable_;
  mutable RateTracker rates_;
};

}  // namespace

absl::StatusOr<DeviceSlotLayout> DeviceSlotLayout::Make(const SlotLayout& host,
                                                        const ferry::v1::ImageOutput& output,
                                                        ferry::v1::DType tokens_output) {
  DeviceSlotLayout layout;
  layout.fields = host.fields;
  const ferry::v1::DType dtype =
      output.dtype() == ferry::v1::DTYPE_UNSPECIFIED ? ferry::v1::UINT8 : output.dtype();
  if (dtype != ferry::v1::UINT8 && dtype != ferry::v1::FLOAT32 && dtype != ferry::v1::FLOAT16 &&
      dtype != ferry::v1::BFLOAT16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image_output.dtype must be UINT8, FLOAT32, FLOAT16 or BFLOAT16 (got ",
        ferry::v1::DType_Name(dtype), ")"));
  }
  if ((output.mean_size() != 0 && output.mean_size() != 3) ||
      (output.std_size() != 0 && output.std_size() != 3)) {
    return absl::InvalidArgumentError("image_output.mean and image_output.std take 3 values (RGB)");
  }
  const auto mean = ImageNetMean();
  const auto std = ImageNetStd();
  for (int c = 0; c < 3; ++c) {
    layout.mean[c] = output.mean_size() == 3 ? output.mean(c) : mean[c];
    layout.std[c] = output.std_size() == 3 ? output.std(c) : std[c];
    if (!(layout.std[c] > 0)) {
      return absl::InvalidArgumentError("image_output.std values must be positive");
    }
  }
  if (dtype != ferry::v1::UINT8) {
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
    if (field.name != "tokens" ||
        (field.dtype != ferry::v1::UINT16 && field.dtype != ferry::v1::UINT32)) {
      continue;
    }
    const ferry::v1::DType out =
        tokens_output == ferry::v1::DTYPE_UNSPECIFIED ? ferry::v1::INT64 : tokens_output;
    if (out != ferry::v1::INT64 && out != ferry::v1::INT32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dataset.tokens.output_dtype must be INT64 or INT32 (got ", ferry::v1::DType_Name(out),
          ")"));
    }
    layout.token_field = static_cast<int>(f);
    layout.token_dtype = out;
    FieldLayout& tokens = layout.fields[f];
    tokens.dtype = out;
    tokens.row_bytes = field.row_bytes / DTypeSize(field.dtype) * DTypeSize(out);
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
      layout.offsets.push_back(static_cast<int>(f) == converted
                                   ? 0
                                   : layout.staging_offset + host.offsets[f]);
    }
    offset = layout.staging_offset + host.slot_bytes;
  } else {
    // Unconverted: identical to the host layout, so one copy moves a whole batch.
    layout.offsets = host.offsets;
    offset = host.slot_bytes;
  }
  layout.slot_bytes = RoundUp(offset, kDeviceSlotAlignment);
  return layout;
}

std::unique_ptr<GpuProvider> MakeCudaGpuProvider(const Topology& topology,
                                                 MemoryBudget* pinned_budget,
                                                 uint64_t device_budget_bytes,
                                                 const std::string& config_path,
                                                 GatherOptions gather) {
  return std::make_unique<CudaGpuProvider>(topology, pinned_budget, device_budget_bytes,
                                           config_path, gather);
}

}  // namespace ferry
