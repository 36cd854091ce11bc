// The decode worker pool: one group of threads per NUMA node, each thread pinned to its
// node's CPUs. Work for a job whose device sits on node N goes to group N, so reads and
// decodes run next to the memory they write; work for "cpu" jobs goes to a shared queue
// that every group serves after its own.
//
// Queues are bounded by construction, not by the pool: a rank only submits the rows of
// slots it owns, so at most (slots x batch size) tasks per rank are ever queued.
//
// Fair sharing: every task has an owner, a rank of a job. Each queue serves its jobs
// round-robin, one task at a time, and within a job its ranks round-robin: a job that
// submitted a thousand rows does not starve one that submitted ten, nor does one rank of a
// job shared by several GPUs starve another (its trainer joined later, or on another GPU).
// A job of eight ranks gets one turn in the queue, as a job of one does. A rank whose
// consumer stalls simply stops submitting (its slots stay full) without holding anything
// another rank needs.
//
// Thread-safe. Tasks must not block on other tasks.
#ifndef FERRY_SERVER_PIPELINE_WORKER_POOL_H_
#define FERRY_SERVER_PIPELINE_WORKER_POOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/dataset/sample_source.h"
#include "server/stats/recent_window.h"
#include "server/topology/topology.h"

namespace ferry {

// Per-thread state a task may use: decoder scratch cached per job.
class WorkerContext final {
 public:
  // Scratch of `source` for this thread, created on first use. `job_serial` is unique per
  // job for the daemon's lifetime, so a recycled address never returns stale scratch.
  SampleSource::Scratch* ScratchFor(uint64_t job_serial, const SampleSource& source);
  int group() const { return group_; }

 private:
  friend class WorkerPool;
  explicit WorkerContext(int group) : group_(group) {}
  int group_;
  struct Entry {
    uint64_t serial;
    std::unique_ptr<SampleSource::Scratch> scratch;
  };
  std::vector<Entry> cache_;  // most recent first, a few entries
};

class WorkerPool final {
 public:
  using Task = std::function<void(WorkerContext&)>;
  static constexpr int kAnyGroup = -1;

  struct GroupInfo {
    int numa_node = -1;
    std::vector<int> cpus;
    int threads = 0;
  };

  // One group per node of `topology`, `threads_per_node` threads each (0: one per CPU),
  // each thread at nice value `nice` (0 to 19), below the trainers' (a thread that already
  // runs at a higher nice value keeps it), and with `sched_idle` under SCHED_IDLE: it runs
  // only on cores no other thread wants.
  static absl::StatusOr<std::unique_ptr<WorkerPool>> Create(const Topology& topology,
                                                            int threads_per_node, int nice = 0,
                                                            bool sched_idle = false);
  ~WorkerPool();  // finishes queued tasks, then joins
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // The group serving NUMA node `node`, kAnyGroup for -1 or an unknown node.
  int GroupForNode(int node) const;
  // The node whose memory should hold data for NUMA node `node`'s workers: `node` when the
  // pool's topology is this machine's (Topology::describes_this_machine), else -1 (a fake
  // topology's nodes may not exist here).
  int MemoryNodeFor(int node) const { return binds_memory_ ? node : -1; }
  struct Owner {
    uint64_t job = 0;  // any id; ferry uses the job's serial
    int rank = 0;
  };
  // Queues `tasks` of `owner` on `group`.
  void Submit(int group, Owner owner, std::vector<Task> tasks);

  const std::vector<GroupInfo>& groups() const { return groups_; }
  int total_threads() const;
  // Of the worker threads' wall time over the last RecentWindow::kSeconds (or since the pool
  // was made), the fraction they spent running tasks, in [0, 1]. A task counts when it
  // ends, spread over the seconds it ran.
  double busy_fraction() const;

 private:
  WorkerPool() = default;
  void Run(int group);

  std::vector<GroupInfo> groups_;  // constant after Create
  int nice_ = 0;                   // constant after Create
  bool sched_idle_ = false;        // constant after Create
  bool binds_memory_ = false;      // constant after Create
  const absl::Time created_ = absl::Now();
  RecentWindow busy_{1};  // seconds spent in tasks, all threads; thread-safe itself
  std::vector<std::thread> threads_;
  absl::Mutex mutex_;
  // Tasks of several owners served round-robin by job, then by rank within the job. Not
  // thread-safe (the pool's mutex guards it).
  class FairQueue {
   public:
    bool empty() const { return turns_.empty(); }
    void Push(Owner owner, Task task);
    Task Pop();  // requires !empty()

   private:
    struct JobTasks {
      absl::flat_hash_map<int, std::deque<Task>> by_rank;
      std::deque<int> turns;  // ranks with queued tasks, next to serve first
    };
    absl::flat_hash_map<uint64_t, JobTasks> by_job_;
    std::deque<uint64_t> turns_;  // jobs with queued tasks, next to serve first
  };

  std::vector<FairQueue> queues_ ABSL_GUARDED_BY(mutex_);  // per group
  FairQueue any_queue_ ABSL_GUARDED_BY(mutex_);
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace ferry

#endif  // FERRY_SERVER_PIPELINE_WORKER_POOL_H_
