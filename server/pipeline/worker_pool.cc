#include "server/pipeline/worker_pool.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/thread_name.h"

namespace ferry {

SampleSource::Scratch* WorkerContext::ScratchFor(uint64_t job_serial, const SampleSource& source) {
  for (size_t i = 0; i < cache_.size(); ++i) {
    if (cache_[i].serial == job_serial) {
      if (i != 0) std::swap(cache_[0], cache_[i]);
      return cache_[0].scratch.get();
    }
  }
  constexpr size_t kMaxCached = 8;
  if (cache_.size() == kMaxCached) cache_.pop_back();
  cache_.insert(cache_.begin(), Entry{job_serial, source.NewScratch()});
  return cache_[0].scratch.get();
}

absl::StatusOr<std::unique_ptr<WorkerPool>> WorkerPool::Create(const Topology& topology,
                                                               int threads_per_node, int nice,
                                                               bool sched_idle) {
  std::unique_ptr<WorkerPool> pool(new WorkerPool());
  pool->nice_ = nice;
  pool->sched_idle_ = sched_idle;
  pool->binds_memory_ = topology.describes_this_machine();
  for (const NumaNode& node : topology.nodes()) {
    GroupInfo g;
    g.numa_node = node.id;
    g.cpus = node.cpus;
    g.threads = threads_per_node > 0 ? threads_per_node : std::max<int>(1, node.cpus.size());
    pool->groups_.push_back(std::move(g));
  }
  if (pool->groups_.empty()) {
    return absl::FailedPreconditionError("topology has no NUMA node with CPUs");
  }
  {
    absl::MutexLock lock(&pool->mutex_);
    pool->queues_.resize(pool->groups_.size());
  }
  for (size_t g = 0; g < pool->groups_.size(); ++g) {
    for (int t = 0; t < pool->groups_[g].threads; ++t) {
      pool->threads_.emplace_back([p = pool.get(), g] { p->Run(static_cast<int>(g)); });
    }
  }
  return pool;
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

int WorkerPool::GroupForNode(int node) const {
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g].numa_node == node) return static_cast<int>(g);
  }
  return kAnyGroup;
}

int WorkerPool::total_threads() const { return static_cast<int>(threads_.size()); }

double WorkerPool::busy_fraction() const {
  const absl::Time now = absl::Now();
  std::vector<double> busy;
  const absl::Time start = std::max(busy_.Sum(now, &busy), created_);
  const double capacity = absl::ToDoubleSeconds(now - start) * total_threads();
  return capacity > 0 ? std::clamp(busy[0] / capacity, 0.0, 1.0) : 0.0;
}

void WorkerPool::FairQueue::Push(Owner owner, Task task) {
  JobTasks& job = by_job_[owner.job];
  if (job.turns.empty()) turns_.push_back(owner.job);
  std::deque<Task>& q = job.by_rank[owner.rank];
  if (q.empty()) job.turns.push_back(owner.rank);
  q.push_back(std::move(task));
}

WorkerPool::Task WorkerPool::FairQueue::Pop() {
  const uint64_t job_id = turns_.front();
  turns_.pop_front();
  auto job = by_job_.find(job_id);
  const int rank = job->second.turns.front();
  job->second.turns.pop_front();
  auto q = job->second.by_rank.find(rank);
  Task task = std::move(q->second.front());
  q->second.pop_front();
  if (q->second.empty()) {
    job->second.by_rank.erase(q);
  } else {
    job->second.turns.push_back(rank);
  }
  if (job->second.turns.empty()) {
    by_job_.erase(job);
  } else {
    turns_.push_back(job_id);
  }
  return task;
}

void WorkerPool::Submit(int group, Owner owner, std::vector<Task> tasks) {
  absl::MutexLock lock(&mutex_);
  FairQueue& q =
      (group >= 0 && group < static_cast<int>(queues_.size())) ? queues_[group] : any_queue_;
  for (Task& t : tasks) q.Push(owner, std::move(t));
}

void WorkerPool::Run(int group) {
  NameThisThread(absl::StrCat("ferry-worker-n", groups_[group].numa_node));
  if (absl::Status s = PinCurrentThreadToCpus(groups_[group].cpus); !s.ok()) {
    FERRY_LOG(WARNING) << "worker of NUMA node " << groups_[group].numa_node
                       << " runs unpinned: " << s;
  }
  // Linux gives each thread its own nice value (setpriority on a thread id). Only ever
  // lowered: a ferryd started at a higher nice keeps its workers there.
  const id_t tid = static_cast<id_t>(::gettid());
  errno = 0;
  const int current = ::getpriority(PRIO_PROCESS, tid);
  if (errno == 0 && nice_ > current && ::setpriority(PRIO_PROCESS, tid, nice_) != 0) {
    FERRY_LOG(WARNING) << "worker of NUMA node " << groups_[group].numa_node
                       << " keeps its priority, nice " << nice_
                       << " refused: " << std::strerror(errno);
  }
  sched_param param{};
  if (sched_idle_ && ::sched_setscheduler(0, SCHED_IDLE, &param) != 0) {
    FERRY_LOG(WARNING) << "worker of NUMA node " << groups_[group].numa_node
                       << " keeps its scheduling policy, SCHED_IDLE refused: "
                       << std::strerror(errno);
  }
  WorkerContext context(group);
  auto has_work = [this, group]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return stopping_ || !queues_[group].empty() || !any_queue_.empty();
  };
  for (;;) {
    Task task;
    {
      absl::MutexLock lock(&mutex_);
      mutex_.Await(absl::Condition(&has_work));
      if (!queues_[group].empty()) {
        task = queues_[group].Pop();
      } else if (!any_queue_.empty()) {
        task = any_queue_.Pop();
      } else {
        return;  // stopping and drained
      }
    }
    const absl::Time start = absl::Now();
    task(context);
    busy_.AddInterval(0, start, absl::Now());
  }
}

}  // namespace ferry
