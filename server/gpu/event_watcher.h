// Runs a callback once each watched piece of device work has completed, from one thread
// of its own: the host side of a CudaStage's "copied", "ready" and "released" signals
// (server/transport/device_stage.h says why the host, not the GPU, waits for the other
// process). The watcher does not know CUDA: a watch carries a CompletionQuery, which for
// CudaStage asks a CudaEvent (cudaEventQuery) and for the tests a fake.
//
//   EventWatcher watcher(counters);
//   watcher.Watch([&event] { return event.IsComplete(); }, EventWatcher::kReleased,
//                 [slot] { OnReleased(slot); });
//
// It polls, backing off from 5 us to 100 us while nothing completes, and sleeps on a
// condition while nothing is watched.
//
// Ordering: watches of kHostSlotCopied and kDeviceSlotReady are in stream order: they are
// queried in the order they were watched, and none after the first one still pending is
// queried in that round (each query takes driver locks that the copy enqueue needs too).
// With several gather streams a batch that completes before one watched ahead of it is
// therefore reported just after that one. kReleased watches are queried independently.
//
// Errors: a query that fails (a dead trainer's event, a device error) is logged as a
// warning and completes its watch, so that no slot stays stuck.
//
// Thread safety: Watch, Forget and seconds may be called from any thread. Callbacks run on
// the watcher's thread, one at a time, in the order their watches completed, without the
// watcher's lock held: they may call Watch and Forget, and may destroy the watcher (a
// callback may drop the last reference to the pipeline that owns it), in which case the
// destructor detaches the thread, which then runs no further callback and returns.
#ifndef FERRY_SERVER_GPU_EVENT_WATCHER_H_
#define FERRY_SERVER_GPU_EVENT_WATCHER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/gpu/gpu_counters.h"

namespace ferry {

class EventWatcher final {
 public:
  // What a watch is for; each has its own latency total, for status.
  enum Kind { kHostSlotCopied, kDeviceSlotReady, kReleased, kNumKinds };

  // Whether the watched work has completed: true, false (still pending), or an error.
  // Called on the watcher's thread with its lock held (so that Forget can end the life of
  // what it reads right after returning): it must not block nor call into the watcher.
  using CompletionQuery = std::function<absl::StatusOr<bool>()>;

  // `counters->in_flight` loses one per kDeviceSlotReady watch that completes or that the
  // destructor drops. `owner` ("job j1 on GPU 0") starts the watcher's log lines.
  EventWatcher(std::shared_ptr<GpuCounters> counters, std::string owner);
  EventWatcher(const EventWatcher&) = delete;
  EventWatcher& operator=(const EventWatcher&) = delete;
  // Drops every watch (their callbacks never run) and stops the thread: joins it, or
  // detaches it when called from one of the callbacks.
  ~EventWatcher();

  // Runs `callback` once `complete` says true (or fails). Whatever `complete` reads must
  // stay alive until the callback has run or Forget(kind) has returned. Watches of
  // kHostSlotCopied and kDeviceSlotReady must be made in the order their work was enqueued
  // (see the ordering above). `also_frees_host_slot`: a kDeviceSlotReady watch that stands
  // for kHostSlotCopied too (its latency counts for both).
  void Watch(CompletionQuery complete, Kind kind, std::function<void()> callback,
             bool also_frees_host_slot = false);
  // Drops every watch of `kind`; none of their callbacks starts after this returns, and
  // none of their queries runs. Counters are not adjusted.
  void Forget(Kind kind);
  // Total seconds from Watch to the completion being seen, over every completed watch of
  // `kind`.
  double seconds(Kind kind) const;

 private:
  struct Item {
    CompletionQuery complete;
    Kind kind;
    std::function<void()> callback;
    absl::Time since;
    bool also_frees_host_slot;
  };
  // Co-owned by the thread, which may outlive the watcher (see the destructor).
  struct State {
    std::shared_ptr<GpuCounters> counters;
    std::string owner;  // constant after construction
    absl::Mutex mutex;
    std::vector<Item> items ABSL_GUARDED_BY(mutex);
    double seconds[kNumKinds] ABSL_GUARDED_BY(mutex) = {};
    bool stopping ABSL_GUARDED_BY(mutex) = false;
  };

  static bool Stopping(State& state);
  static void Run(State& state);
  // Queries the items in order (see the class comment), moving the callbacks of those
  // complete into `done` and removing their items.
  static void CollectCompleted(State& state, std::vector<std::function<void()>>& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mutex);

  const std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace ferry

#endif  // FERRY_SERVER_GPU_EVENT_WATCHER_H_
