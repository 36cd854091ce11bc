#include "common/batch_channel.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

constexpr uint64_t kMagic = 0x6c6e6e6168637966;  // "fychannl", little-endian
constexpr uint32_t kVersion = 1;

// Byte layout of the memfd:
//   [0, 64)      Header
//   [64, 256)    Indices of ring 0 (daemon -> trainer)
//   [256, 448)   Indices of ring 1 (trainer -> daemon)
//   [512, ...)   capacity entries of ring 0, then capacity entries of ring 1
// The memfd is zero-filled, so fresh indices are 0.
struct Header {
  uint64_t magic;
  uint32_t version;
  uint32_t capacity;
};
// head: written by the producer (entries below it are complete); tail: written by the
// consumer (entries below it may be overwritten); consumer_sleeping: set by a consumer
// about to sleep, cleared by the producer that wakes it. Each on its own cache line so the
// two processes do not bounce one line between them.
struct Indices {
  alignas(64) std::atomic<uint64_t> head;
  alignas(64) std::atomic<uint64_t> tail;
  alignas(64) std::atomic<uint32_t> consumer_sleeping;
};
static_assert(sizeof(Indices) == 192);
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "the rings' indices are shared between processes: they must be lock-free");
constexpr size_t kIndicesOffset[2] = {64, 256};
constexpr size_t kEntriesOffset = 512;

size_t BytesFor(uint32_t capacity) {
  const size_t bytes = kEntriesOffset + 2 * size_t{capacity} * sizeof(ChannelMessage);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

absl::Status Errno(const char* what) {
  return absl::InternalError(absl::StrCat(what, " for the batch channel: ", strerror(errno)));
}

// One byte on a wake socket. Never blocks: a full socket buffer (EAGAIN) already holds
// wakeups the peer has not read, and a closed peer (EPIPE) has nobody left to wake.
void Wake(int fd) {
  const char byte = 1;
  ssize_t unused = ::send(fd, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  (void)unused;
}

}  // namespace

struct BatchChannel::Ring {
  Indices* indices;
  uint8_t* entries;
};

BatchChannel::BatchChannel(bool daemon_side, UniqueFd wake_in, UniqueFd wake_out, uint8_t* base,
                           size_t bytes, uint32_t capacity)
    : daemon_side_(daemon_side),
      wake_in_(std::move(wake_in)),
      wake_out_(std::move(wake_out)),
      base_(base),
      bytes_(bytes),
      capacity_(capacity) {}

BatchChannel::~BatchChannel() { ::munmap(base_, bytes_); }

absl::StatusOr<std::unique_ptr<BatchChannel>> BatchChannel::Create(uint32_t min_capacity) {
  if (min_capacity == 0 || min_capacity > kMaxCapacity) {
    return absl::InvalidArgumentError(absl::StrCat("batch channel capacity ", min_capacity,
                                                   " is outside [1, ", kMaxCapacity, "]"));
  }
  uint32_t capacity = 1;
  while (capacity < min_capacity) capacity <<= 1;
  const size_t bytes = BytesFor(capacity);
  UniqueFd memfd(::memfd_create("ferry-batch-channel", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!memfd.valid()) return Errno("memfd_create");
  if (::ftruncate(memfd.get(), static_cast<off_t>(bytes)) != 0) return Errno("ftruncate");
  // The trainer gets this fd: sealed, it cannot shrink the file under ferryd's mapping
  // (which would make ferryd's next access a SIGBUS).
  if (::fcntl(memfd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Errno("sealing the memfd");
  }
  // [0]: ferryd's end, [1]: the trainer's.
  int to_trainer[2], to_daemon[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, to_trainer) != 0) {
    return Errno("socketpair");
  }
  UniqueFd daemon_out(to_trainer[0]), trainer_in(to_trainer[1]);
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, to_daemon) != 0) {
    return Errno("socketpair");
  }
  UniqueFd daemon_in(to_daemon[0]), trainer_out(to_daemon[1]);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0);
  if (p == MAP_FAILED) return Errno("mmap");
  auto* base = static_cast<uint8_t*>(p);
  auto* header = new (base) Header{kMagic, kVersion, capacity};
  (void)header;
  for (size_t offset : kIndicesOffset) {
    auto* indices = new (base + offset) Indices();
    // Nobody has looked at the ring yet: the first message must wake its reader.
    indices->consumer_sleeping.store(1);
  }
  std::unique_ptr<BatchChannel> channel(new BatchChannel(
      /*daemon_side=*/true, std::move(daemon_in), std::move(daemon_out), base, bytes, capacity));
  channel->handover_[0] = std::move(memfd);
  channel->handover_[1] = std::move(trainer_in);
  channel->handover_[2] = std::move(trainer_out);
  return channel;
}

absl::StatusOr<std::unique_ptr<BatchChannel>> BatchChannel::Attach(UniqueFd memfd,
                                                                   UniqueFd trainer_wake_in,
                                                                   UniqueFd trainer_wake_out) {
  if (!memfd.valid() || !trainer_wake_in.valid() || !trainer_wake_out.valid()) {
    return absl::InternalError("ferryd handed over a batch channel without its three fds");
  }
  struct stat st;
  if (::fstat(memfd.get(), &st) != 0) return Errno("fstat");
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < BytesFor(1)) {
    return absl::InternalError(
        absl::StrCat("the batch channel memfd holds ", size, " bytes, too few for a channel"));
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0);
  if (p == MAP_FAILED) return Errno("mmap");
  auto* base = static_cast<uint8_t*>(p);
  Header header;
  memcpy(&header, base, sizeof(header));
  const uint32_t capacity = header.capacity;
  if (header.magic != kMagic || header.version != kVersion || capacity == 0 ||
      capacity > kMaxCapacity || (capacity & (capacity - 1)) != 0 || BytesFor(capacity) != size) {
    ::munmap(p, size);
    return absl::InternalError(absl::StrCat(
        "the batch channel from ferryd has an unknown layout (version ", header.version,
        ", capacity ", capacity, ", ", size, " bytes); is ferryd of another version?"));
  }
  UniqueFd self_wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!self_wake.valid()) {
    ::munmap(p, size);
    return Errno("eventfd");
  }
  // The mapping keeps the memory; the memfd itself is not needed any more.
  std::unique_ptr<BatchChannel> channel(new BatchChannel(
      /*daemon_side=*/false, std::move(trainer_wake_in), std::move(trainer_wake_out), base, size,
      capacity));
  channel->self_wake_ = std::move(self_wake);
  return channel;
}

std::vector<int> BatchChannel::HandoverFds() const {
  return {handover_[0].get(), handover_[1].get(), handover_[2].get()};
}

void BatchChannel::DropHandoverFds() {
  for (UniqueFd& fd : handover_) fd.Reset();
}

BatchChannel::Ring BatchChannel::outgoing() const {
  const int ring = daemon_side_ ? 0 : 1;
  return Ring{reinterpret_cast<Indices*>(base_ + kIndicesOffset[ring]),
              base_ + kEntriesOffset + ring * size_t{capacity_} * sizeof(ChannelMessage)};
}

BatchChannel::Ring BatchChannel::incoming() const {
  const int ring = daemon_side_ ? 1 : 0;
  return Ring{reinterpret_cast<Indices*>(base_ + kIndicesOffset[ring]),
              base_ + kEntriesOffset + ring * size_t{capacity_} * sizeof(ChannelMessage)};
}

absl::Status BatchChannel::Send(const ChannelMessage& message) {
  const Ring ring = outgoing();
  const uint64_t tail = ring.indices->tail.load(std::memory_order_acquire);
  const uint64_t used = send_head_ - tail;
  if (used > capacity_) {
    return absl::DataLossError(absl::StrCat("the batch channel's read index is impossible (", tail,
                                            " read, ", send_head_, " written, ring of ", capacity_,
                                            "): ", peer(), " wrote over the channel"));
  }
  if (used == capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat("the batch channel is full (", capacity_,
                                                     " messages unread): ", peer(),
                                                     " is not reading it"));
  }
  memcpy(ring.entries + (send_head_ & (capacity_ - 1)) * sizeof(ChannelMessage), &message,
         sizeof(message));
  ++send_head_;
  // Sequentially consistent with the consumer's PrepareToSleep: either it sees this head
  // before it sleeps, or this side sees its flag and wakes it.
  ring.indices->head.store(send_head_, std::memory_order_seq_cst);
  if (ring.indices->consumer_sleeping.load(std::memory_order_seq_cst) != 0 &&
      ring.indices->consumer_sleeping.exchange(0) != 0) {
    Wake(wake_out_.get());
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> BatchChannel::Receive(ChannelMessage* message) {
  const Ring ring = incoming();
  const uint64_t head = ring.indices->head.load(std::memory_order_acquire);
  if (head == receive_tail_) return false;
  if (head - receive_tail_ > capacity_) {
    return absl::DataLossError(absl::StrCat("the batch channel's write index is impossible (", head,
                                            " written, ", receive_tail_, " read, ring of ",
                                            capacity_, "): ", peer(), " wrote over the channel"));
  }

  memcpy(message, ring.entries + (receive_tail_ & (capacity_ - 1)) * sizeof(ChannelMessage),
         sizeof(*message));
  ++receive_tail_;
  ring.indices->tail.store(receive_tail_, std::memory_order_release);
  return true;
}

bool BatchChannel::PrepareToSleep() {
  const Ring ring = incoming();
  ring.indices->consumer_sleeping.exchange(1, std::memory_order_seq_cst);
  if (ring.indices->head.load(std::memory_order_seq_cst) != receive_tail_) {
    ring.indices->consumer_sleeping.store(0, std::memory_order_relaxed);
    return false;
  }
  return true;
}

void BatchChannel::ClearWakeups() {
  incoming().indices->consumer_sleeping.store(0, std::memory_order_relaxed);
  char buf[256];
  for (size_t read = 0; read < kMaxWakeBytesPerClear; read += sizeof(buf)) {
    const ssize_t n = ::recv(wake_in_.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) peer_closed_ = true;  // and the socket stays readable: do not spin on it
    if (n < static_cast<ssize_t>(sizeof(buf))) break;
  }

  if (self_wake_.valid()) {
    uint64_t count;
    ssize_t unused = ::read(self_wake_.get(), &count, sizeof(count));  // our own, non-blocking
    (void)unused;
  }
}

void BatchChannel::WakeSelf() {
  if (!self_wake_.valid()) return;
  const uint64_t one = 1;
  ssize_t unused = ::write(self_wake_.get(), &one, sizeof(one));
  (void)unused;
}

absl::StatusOr<bool> BatchChannel::ReceiveOrWait(ChannelMessage* message, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    absl::StatusOr<bool> got = Receive(message);
    if (!got.ok() || *got) return got;
    if (peer_closed_) return false;  // nobody left to wake this side
    if (!PrepareToSleep()) continue;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      ClearWakeups();
      return Receive(message);
    }
    pollfd p[2] = {{wake_in_.get(), POLLIN, 0}, {self_wake_.get(), POLLIN, 0}};
    const timespec ts = absl::ToTimespec(left);
    const int n = ::ppoll(p, self_wake_.valid() ? 2 : 1, &ts, nullptr);
    const int poll_errno = errno;
    ClearWakeups();
    if (n < 0 && poll_errno != EINTR) {
      errno = poll_errno;
      return Errno("ppoll");
    }
    got = Receive(message);
    if (!got.ok() || *got) return got;
    // Without a message: return after WakeSelf, a signal or the deadline (the caller looks
    // around), or once the peer is gone. A wake byte alone can be stale (the peer saw this
    // side about to sleep just as it found a message and stayed awake): sleep again.
    const bool woken_by_self = n > 0 && self_wake_.valid() && (p[1].revents & POLLIN) != 0;
    if (woken_by_self || n < 0 || peer_closed_ || absl::Now() >= deadline) return false;
  }
}

}  // namespace ferry
