// One thread that waits on many file descriptors (the batch channels' wake sockets)
// and runs each one's handler when it becomes readable. Level-triggered: a handler must
// drain what woke it (BatchChannel::ClearWakeups) or it runs again at once.
//
//   ChannelPoller poller;                       // starts the thread "ferry-channels"
//   auto id = poller.Add(fd, [&] { Drain(); });
//   ...
//   poller.Remove(id);                          // after this, the handler never runs again
//
// Thread-safe. Handlers run on the poller's thread, one at a time.
#ifndef FERRY_SERVER_SERVICE_CHANNEL_POLLER_H_
#define FERRY_SERVER_SERVICE_CHANNEL_POLLER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"

namespace ferry {

class ChannelPoller final {
 public:
  static absl::StatusOr<std::unique_ptr<ChannelPoller>> Start();
  ~ChannelPoller();  // stops the thread; handlers still registered are dropped
  ChannelPoller(const ChannelPoller&) = delete;
  ChannelPoller& operator=(const ChannelPoller&) = delete;

  // Runs `on_readable(id)` on the poller's thread whenever `fd` is readable (also right
  // away if it already is; possibly before Add has returned the id, hence the argument).
  // `fd` stays owned by the caller and must outlive the registration.
  absl::StatusOr<uint64_t> Add(int fd, std::function<void(uint64_t id)> on_readable);
  // Ends a registration. When it returns, the handler is not running and never runs again,
  // unless Remove is called from that handler itself (then it returns at once, and the
  // handler must not touch what the removal was to protect after it returns). A removed
  // or unknown id is not an error: Remove still waits for its handler if it is running
  // (one that removed itself and goes on, e.g. to end its stream).

  void Remove(uint64_t id);
  // From a handler: run it again soon even if its fd is not readable, after the handlers
  // of fds that are (a handler that stops early to let others run asks for this).
  void RunAgain(uint64_t id);

 private:
  ChannelPoller(UniqueFd epoll, UniqueFd wake);
  void Run();

  const UniqueFd epoll_;
  const UniqueFd wake_;  // eventfd: the destructor writes it to stop Run()
  std::thread thread_;
  std::thread::id thread_id_;

  struct Entry {
    int fd;
    std::function<void(uint64_t)> on_readable;
  };
  absl::Mutex mutex_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Entry>> entries_ ABSL_GUARDED_BY(mutex_);
  uint64_t next_id_ ABSL_GUARDED_BY(mutex_) = 1;
  uint64_t running_ ABSL_GUARDED_BY(mutex_) = 0;         // id of the handler running now, or 0
  std::vector<uint64_t> again_ ABSL_GUARDED_BY(mutex_);  // RunAgain's ids, in order
};

}  // namespace ferry

#endif  // FERRY_SERVER_SERVICE_CHANNEL_POLLER_H_
