// The batch channel: the Consume stream's data plane in shared memory.
//
// Why: a trainer that takes 1 MiB batches needs tens of thousands of BatchReady / Release
// pairs a second per rank. Over gRPC each of them crosses two threads and an HTTP/2 frame
// on each side, which holds every slot hundreds of microseconds longer than the trainer
// needs it (docs/benchmarks.md, "The batch channel"). Here a message is a 40-byte
// descriptor written into a ring in a memfd both processes map, and the reader is woken
// (one byte on a wake socket) only when it said it is going to sleep, so a busy pair
// exchanges messages without a system call.
//
// Shape: two single-producer single-consumer rings in one memfd, one per direction, each
// with a Unix socket pair to wake its consumer. ferryd creates the channel (Create) and
// hands the memfd and the trainer's ends of both socket pairs over the session socket; the
// trainer maps them (Attach). Socket pairs, not eventfds, because each side then has its
// own open file: a trainer cannot make ferryd's end blocking (O_NONBLOCK lives in the open
// file, which SCM_RIGHTS shares) and so cannot stall ferryd's threads in read or write. The gRPC
// Consume stream stays: it opens the channel (Open.channel), carries the final status (errors,
// shutdown) and its end is either side's death.
//
//   daemon -> trainer: kBatchReady, kEpochEnd
//   trainer -> daemon: kStartEpoch, kRelease
//
// Trust: each side keeps its own copy of the indices it owns and only publishes them; an
// index written by the peer is checked before use (DATA_LOSS when it is impossible), the
// memfd is sealed against resizing, a descriptor is copied out of shared memory before it
// is looked at, and wake sockets are only used with MSG_DONTWAIT, so a trainer that
// scribbles on the channel can break only its own stream.
//
// Thread-safety: Send from one thread at a time, Receive / PrepareToSleep / ClearWakeups /
// ReceiveOrWait from one thread at a time (callers serialize); WakeSelf from any thread.
#ifndef FERRY_COMMON_BATCH_CHANNEL_H_
#define FERRY_COMMON_BATCH_CHANNEL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"

namespace ferry {

// One message. Plain data, the same layout in both processes (x86-64 / aarch64 Linux).
struct ChannelMessage {
  enum Kind : uint32_t {
    kBatchReady = 1,  // slot, seq, epoch, batch, num_samples
    kEpochEnd = 2,    // epoch
    kStartEpoch = 3,  // epoch, batch (= first batch)
    kRelease = 4,     // slot, seq, flags; with kReleaseWaited, batch = wait in microseconds
  };
  // kRelease flags: the trainer's last use of the (GPU) slot is over already, see
  // ConsumeRequest.Release.complete.
  static constexpr uint32_t kReleaseComplete = 1;
  // kRelease flags: `batch` holds how long the trainer's Next blocked, in microseconds,
  // before this batch was handed to it (ConsumeRequest.Release.wait_us). Older clients
  // leave the flag clear; ferryd then estimates the wait itself.
  static constexpr uint32_t kReleaseWaited = 2;

  uint32_t kind = 0;
  uint32_t slot = 0;
  int64_t seq = 0;
  int64_t epoch = 0;
  int64_t batch = 0;
  uint32_t num_samples = 0;
  uint32_t flags = 0;
};
static_assert(sizeof(ChannelMessage) == 40, "the descriptor layout is part of the protocol");

class BatchChannel final {
 public:
  // ferryd's end: a sealed memfd with two rings of at least `min_capacity` entries each
  // (rounded up to a power of two, at most kMaxCapacity), and two socket pairs.
  static absl::StatusOr<std::unique_ptr<BatchChannel>> Create(uint32_t min_capacity);
  // The trainer's end, from the fds ferryd handed over (HandoverFds, in order): checks the
  // size, magic and capacity.
  static absl::StatusOr<std::unique_ptr<BatchChannel>> Attach(UniqueFd memfd,
                                                              UniqueFd trainer_wake_in,
                                                              UniqueFd trainer_wake_out);
  ~BatchChannel();
  BatchChannel(const BatchChannel&) = delete;
  BatchChannel& operator=(const BatchChannel&) = delete;

  static constexpr uint32_t kMaxCapacity = 1u << 16;

  // Appends `message` to the outgoing ring and wakes the peer if it sleeps.
  // RESOURCE_EXHAUSTED when the ring is full (the peer is not reading); DATA_LOSS when the
  // peer's index is impossible (it wrote over the channel).
  absl::Status Send(const ChannelMessage& message);
  // The next incoming message: true and `*message` filled, or false when the ring is empty.
  // DATA_LOSS when the peer's index is impossible.
  absl::StatusOr<bool> Receive(ChannelMessage* message);

  // Sleeping, for the consumer of the incoming ring: PrepareToSleep tells the peer to wake
  // this side on its next Send, and returns false (do not sleep) when a message is already
  // waiting. After it returned true, wait for wake_fd() to become readable (poll, epoll),
  // then ClearWakeups.
  bool PrepareToSleep();
  // Reads at most kMaxWakeBytesPerClear bytes of wakeups: an honest peer sends one per
  // sleep, and a peer that floods the socket must not hold the caller (ferryd's one
  // channel thread) here; what is left keeps wake_fd() readable, so the caller's poll
  // comes back to it.
  void ClearWakeups();
  static constexpr size_t kMaxWakeBytesPerClear = 4096;

  // The fd that becomes readable when the peer wakes this side (or closes its end).
  int wake_fd() const { return wake_in_.get(); }
  // True once ClearWakeups found the peer's end of the wake socket closed (it exited or
  // gave the channel up): nothing will wake this side any more.
  bool peer_closed() const { return peer_closed_; }
  // Receive, sleeping up to `timeout` for a message: false when none came in time, after
  // WakeSelf, or once the peer closed its end.
  absl::StatusOr<bool> ReceiveOrWait(ChannelMessage* message, absl::Duration timeout);
  // Trainer's end: makes a pending or the next ReceiveOrWait return (the stream ended).
  void WakeSelf();

  // ferryd's end, until DropHandoverFds: the memfd and the trainer's two wake sockets, in
  // the order Attach takes them; still owned by the channel.
  std::vector<int> HandoverFds() const;
  // Closes them once they are sent (the channel keeps its mapping and its own sockets).
  void DropHandoverFds();
  size_t bytes() const { return bytes_; }
  uint32_t capacity() const { return capacity_; }

 private:
  struct Ring;
  BatchChannel(bool daemon_side, UniqueFd wake_in, UniqueFd wake_out, uint8_t* base, size_t bytes,
               uint32_t capacity);
  Ring outgoing() const;
  Ring incoming() const;
  // "ferryd" or "the trainer", for error messages.
  const char* peer() const { return daemon_side_ ? "the trainer" : "ferryd"; }

  const bool daemon_side_;
  const UniqueFd wake_in_;   // readable when the peer wakes this side
  const UniqueFd wake_out_;  // one byte here wakes the peer
  UniqueFd self_wake_;       // trainer's end: an eventfd of its own, for WakeSelf
  UniqueFd handover_[3];     // ferryd's end, until sent: memfd, trainer's wake in / out
  bool peer_closed_ = false;
  uint8_t* const base_;
  const size_t bytes_;
  const uint32_t capacity_;
  // The indices this side owns; never read back from shared memory.
  uint64_t send_head_ = 0;     // next entry to write in the outgoing ring
  uint64_t receive_tail_ = 0;  // next entry to read in the incoming ring
};

}  // namespace ferry

#endif  // FERRY_COMMON_BATCH_CHANNEL_H_
