#include "server/service/handler_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/thread_name.h"

namespace ferry {

HandlerPool::HandlerPool(int threads, std::string name, size_t max_queued_per_uid)
    : max_per_uid_(std::max<size_t>(1, static_cast<size_t>(threads) / 2)),
      max_queued_per_uid_(max_queued_per_uid) {
  for (int i = 0; i < std::max(1, threads); ++i) {
    threads_.emplace_back([this, name] {
      NameThisThread(name);
      Loop();
    });
  }
}

HandlerPool::~HandlerPool() { Stop(); }

void HandlerPool::Run(unsigned uid, absl::Time deadline, Task task) {
  absl::Status refused;
  {
    absl::MutexLock lock(&mutex_);
    auto mine = queued_.find(uid);
    if (stopping_) {
      refused = absl::UnavailableError("ferryd is stopping; try again once it is back");
    } else if (mine != queued_.end() && mine->second.size() >= max_queued_per_uid_) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("uid ", uid, " has ", mine->second.size(),
                       " CreateJob and Attach calls waiting for ferryd's handler threads, the "
                       "most one user may have; wait for them to finish before making more"));
    } else {
      std::deque<Queued>& calls = queued_[uid];
      if (calls.empty()) turn_.push_back(uid);
      calls.push_back(Queued{deadline, std::move(task)});
      return;
    }
  }
  task(std::move(refused));
}

void HandlerPool::Stop() {
  std::vector<Task> dropped;
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
    for (auto& [uid, calls] : queued_) {
      for (Queued& call : calls) dropped.push_back(std::move(call.task));
    }
    queued_.clear();
    turn_.clear();
  }
  for (Task& task : dropped) {
    task(absl::UnavailableError("ferryd is stopping; try again once it is back"));
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

size_t HandlerPool::running(unsigned uid) const {
  absl::MutexLock lock(&mutex_);
  auto it = running_.find(uid);
  return it == running_.end() ? 0 : it->second;
}

bool HandlerPool::RunnableLocked() const {
  for (unsigned uid : turn_) {
    auto it = running_.find(uid);
    if (it == running_.end() || it->second < max_per_uid_) return true;
  }
  return false;
}

bool HandlerPool::TakeLocked(unsigned* uid, Queued* call) {
  for (size_t i = 0; i < turn_.size(); ++i) {
    const unsigned candidate = turn_[i];
    auto running = running_.find(candidate);
    if (running != running_.end() && running->second >= max_per_uid_) continue;
    std::deque<Queued>& calls = queued_.at(candidate);
    *call = std::move(calls.front());
    calls.pop_front();
    turn_.erase(turn_.begin() + static_cast<std::ptrdiff_t>(i));
    if (calls.empty()) {
      queued_.erase(candidate);
    } else {
      turn_.push_back(candidate);  // its next call waits for every other uid's turn
    }
    ++running_[candidate];
    *uid = candidate;
    return true;
  }
  return false;
}

void HandlerPool::Loop() {
  for (;;) {
    unsigned uid = 0;
    Queued call;
    {
      absl::MutexLock lock(&mutex_);
      auto work = [this]()
                      ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return stopping_ || RunnableLocked(); };
      mutex_.Await(absl::Condition(&work));
      if (stopping_) return;
      TakeLocked(&uid, &call);
    }
    if (absl::Now() > call.deadline) {
      call.task(absl::DeadlineExceededError(
          "the call's deadline passed while it waited for a handler thread (ferryd is busy "
          "creating other jobs); try again"));
    } else {
      call.task(absl::OkStatus());
    }
    call.task = nullptr;  // what it captured goes before the count drops
    absl::MutexLock lock(&mutex_);
    auto it = running_.find(uid);
    if (--it->second == 0) running_.erase(it);
  }
}

}  // namespace ferry
