#include "server/gpu/event_watcher.h"

#include <sys/prctl.h>

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/thread_name.h"

namespace ferry {
namespace {

constexpr absl::Duration kMinBackoff = absl::Microseconds(5);
constexpr absl::Duration kMaxBackoff = absl::Microseconds(100);

}  // namespace

EventWatcher::EventWatcher(std::shared_ptr<GpuCounters> counters, std::string owner)
    : state_(std::make_shared<State>()) {
  state_->counters = std::move(counters);
  state_->owner = std::move(owner);
  thread_ = std::thread([state = state_] { Run(*state); });
}

EventWatcher::~EventWatcher() {
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

void EventWatcher::Watch(CompletionQuery complete, Kind kind, std::function<void()> callback,
                         bool also_frees_host_slot) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&state_->mutex);
  state_->items.push_back(
      {std::move(complete), kind, std::move(callback), now, also_frees_host_slot});
}

void EventWatcher::Forget(Kind kind) {
  absl::MutexLock lock(&state_->mutex);
  std::erase_if(state_->items, [kind](const Item& item) { return item.kind == kind; });
}

double EventWatcher::seconds(Kind kind) const {
  absl::MutexLock lock(&state_->mutex);
  return state_->seconds[kind];
}

bool EventWatcher::Stopping(State& state) {
  absl::MutexLock lock(&state.mutex);
  return state.stopping;
}

void EventWatcher::CollectCompleted(State& state, std::vector<std::function<void()>>& done) {
  const absl::Time now = absl::Now();
  // The copy stream's work completes in the order it was enqueued, which is the order it
  // was watched (nearly so with several gather streams): after the first one still
  // pending, none of the others is queried.
  bool stream_pending = false;
  // Queried under the lock: Forget may end what a query reads right after it returns.
  std::erase_if(state.items, [&](Item& item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mutex) {
    const bool in_stream_order = item.kind != kReleased;
    if (in_stream_order && stream_pending) return false;
    absl::StatusOr<bool> complete = item.complete();
    if (complete.ok() && !*complete && in_stream_order) stream_pending = true;
    if (!complete.ok()) {
      // A dead trainer's event, or a device error: the copy stream reports the latter on
      // its next call; never leave a slot stuck.
      FERRY_LOG(WARNING) << state.owner << ": event watch: " << complete.status();
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

void EventWatcher::Run(State& state) {
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
      CollectCompleted(state, done);
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

}  // namespace ferry
