#include "server/service/channel_poller.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/thread_name.h"

namespace ferry {

absl::StatusOr<std::unique_ptr<ChannelPoller>> ChannelPoller::Start() {
  UniqueFd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll.valid()) return absl::InternalError(absl::StrCat("epoll_create1: ", strerror(errno)));
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return absl::InternalError(absl::StrCat("eventfd: ", strerror(errno)));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;  // id 0: the stop signal
  if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, wake.get(), &ev) != 0) {
    return absl::InternalError(absl::StrCat("epoll_ctl: ", strerror(errno)));
  }
  std::unique_ptr<ChannelPoller> poller(new ChannelPoller(std::move(epoll), std::move(wake)));
  poller->thread_ = std::thread([p = poller.get()] { p->Run(); });
  poller->thread_id_ = poller->thread_.get_id();
  return poller;
}

ChannelPoller::ChannelPoller(UniqueFd epoll, UniqueFd wake)
    : epoll_(std::move(epoll)), wake_(std::move(wake)) {}

ChannelPoller::~ChannelPoller() {
  const uint64_t one = 1;
  ssize_t unused = ::write(wake_.get(), &one, sizeof(one));
  (void)unused;
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<uint64_t> ChannelPoller::Add(int fd, std::function<void(uint64_t id)> on_readable) {
  absl::MutexLock lock(&mutex_);
  const uint64_t id = next_id_++;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = id;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
    return absl::InternalError(
        absl::StrCat("epoll_ctl(ADD) of a batch channel: ", strerror(errno)));
  }
  entries_[id] = std::make_shared<Entry>(Entry{fd, std::move(on_readable)});
  return id;
}

void ChannelPoller::Remove(uint64_t id) {
  absl::MutexLock lock(&mutex_);
  auto it = entries_.find(id);
  if (it != entries_.end()) {
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second->fd, nullptr);
    entries_.erase(it);
  }
  if (std::this_thread::get_id() == thread_id_) return;  // called by the handler itself
  // Also when the id is gone already: a handler that removed itself may still be running,
  // and the caller is about to destroy what it uses.
  auto idle = [this, id]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return running_ != id; };
  mutex_.Await(absl::Condition(&idle));
}

void ChannelPoller::RunAgain(uint64_t id) {
  if (id == 0) return;  // 0 is the stop signal, never a registration
  absl::MutexLock lock(&mutex_);
  again_.push_back(id);
}

void ChannelPoller::Run() {
  NameThisThread("ferry-channels");
  epoll_event events[64];
  std::vector<uint64_t> ids;
  for (;;) {
    bool again;
    {
      absl::MutexLock lock(&mutex_);
      again = !again_.empty();
    }
    const int n = ::epoll_wait(epoll_.get(), events, 64, again ? 0 : -1);
    if (n < 0 && errno != EINTR) {
      FERRY_LOG(ERROR) << "batch channel epoll_wait failed: " << strerror(errno);
      return;
    }
    ids.clear();
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;  // epoll_event is packed: copy, never bind
      ids.push_back(id);
    }
    {
      absl::MutexLock lock(&mutex_);
      ids.insert(ids.end(), again_.begin(), again_.end());
      again_.clear();
    }
    for (const uint64_t id : ids) {
      if (id == 0) return;  // the destructor
      std::shared_ptr<Entry> entry;
      {
        absl::MutexLock lock(&mutex_);
        auto it = entries_.find(id);
        if (it == entries_.end()) continue;  // removed meanwhile
        entry = it->second;
        running_ = id;
      }
      entry->on_readable(id);
      absl::MutexLock lock(&mutex_);
      running_ = 0;
    }
  }
}

}  // namespace ferry
