// Threads for the RPC handlers that may take long: CreateJob opens and indexes a dataset
// (listing directories, reading tar indexes, building a blend's table) and Attach allocates,
// binds and registers a rank's slab. gRPC's callback reactors must never block (a few slow
// handlers would leave every other call, `ferryctl status` included, unanswered), so those
// handlers run here and finish their reactor from here; quick calls stay on the reactor.
//
// Fair between users: queued calls are taken one uid at a time in turn, and one uid runs on
// at most half of the threads, so one user's slow CreateJobs never hold up another user's.
// A call whose deadline passed while it waited is not run, and one uid has at most
// `max_queued_per_uid` calls waiting (more are refused with RESOURCE_EXHAUSTED at once).
//
//   pool.Run(caller.uid, deadline, [reactor, ...](absl::Status ready) {
//     if (!ready.ok()) return reactor->Finish(ToGrpcStatus(ready));  // expired or stopping
//     ... the work ...
//     reactor->Finish(...);
//   });
//
// Thread-safe.
#ifndef FERRY_SERVER_SERVICE_HANDLER_POOL_H_
#define FERRY_SERVER_SERVICE_HANDLER_POOL_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ferry {

class HandlerPool final {
 public:
  // A call: `ready` is OK when it should do its work, DEADLINE_EXCEEDED when its deadline
  // passed while it waited, UNAVAILABLE when the pool stops before its turn,
  // RESOURCE_EXHAUSTED when its uid already has max_queued_per_uid calls waiting. Called
  // exactly once, on a pool thread (or, when refused at once, on the caller's).
  using Task = std::function<void(absl::Status ready)>;

  static constexpr size_t kDefaultMaxQueuedPerUid = 256;
  // `threads` >= 1, each named `name` (at most 15 characters).
  HandlerPool(int threads, std::string name, size_t max_queued_per_uid = kDefaultMaxQueuedPerUid);
  ~HandlerPool();  // Stop()
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  void Run(unsigned uid, absl::Time deadline, Task task);

  // Runs no more calls: those queued get UNAVAILABLE "ferryd is stopping" now, and so does
  // every later one; waits for the running ones. Idempotent.
  void Stop();

  // Calls of `uid` running now; threads a uid may run on at most.
  size_t running(unsigned uid) const;
  size_t max_per_uid() const { return max_per_uid_; }

 private:
  struct Queued {
    absl::Time deadline;
    Task task;
  };
  void Loop();
  // The next call whose uid may run now, in turn after `last_uid_`; false when none.
  bool TakeLocked(unsigned* uid, Queued* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  bool RunnableLocked() const ABSL_SHARED_LOCKS_REQUIRED(mutex_);

  const size_t max_per_uid_;
  const size_t max_queued_per_uid_;
  mutable absl::Mutex mutex_;
  absl::flat_hash_map<unsigned, std::deque<Queued>> queued_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<unsigned, size_t> running_ ABSL_GUARDED_BY(mutex_);  // no zero entries
  std::deque<unsigned> turn_ ABSL_GUARDED_BY(mutex_);  // uids with queued calls, in turn order
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ferry

#endif  // FERRY_SERVER_SERVICE_HANDLER_POOL_H_
