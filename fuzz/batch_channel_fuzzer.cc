// libFuzzer harness: the batch channel with a hostile trainer. The trainer's end may send
// any message and scribble anywhere on the shared memory (it maps it writable); ferryd's end
// must answer every Receive / Send with a message or a status, never crash or read outside
// the mapping. The input is a list of operations:
//   0: the trainer sends the next 40 bytes as a message     1: ferryd receives
//   2: ferryd sends the next 40 bytes                        3: the trainer receives
//   4: the trainer writes: 2-byte offset, 1-byte length, the bytes   5: ferryd sleeps/wakes
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "common/batch_channel.h"

namespace {

// Reads `n` bytes of the input into `out`; false at the end.
bool Take(const uint8_t*& data, size_t& size, void* out, size_t n) {
  if (size < n) return false;
  std::memcpy(out, data, n);
  data += n;
  size -= n;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto daemon = ferry::BatchChannel::Create(4);
  if (!daemon.ok()) return 0;
  std::vector<int> fds = (*daemon)->HandoverFds();
  auto trainer = ferry::BatchChannel::Attach(
      ferry::UniqueFd(dup(fds[0])), ferry::UniqueFd(dup(fds[1])), ferry::UniqueFd(dup(fds[2])));
  if (!trainer.ok()) return 0;
  const size_t bytes = (*daemon)->bytes();
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
  (*daemon)->DropHandoverFds();
  if (map == MAP_FAILED) return 0;
  auto* shared = static_cast<uint8_t*>(map);
  uint8_t op = 0;
  while (Take(data, size, &op, 1)) {
    ferry::ChannelMessage m;
    switch (op % 6) {
      case 0:
        if (!Take(data, size, &m, sizeof(m))) break;
        (void)(*trainer)->Send(m);
        break;
      case 1:
        (void)(*daemon)->Receive(&m);
        break;
      case 2:
        if (!Take(data, size, &m, sizeof(m))) break;
        (void)(*daemon)->Send(m);
        break;
      case 3:
        (void)(*trainer)->Receive(&m);
        break;
      case 4: {
        uint16_t offset = 0;
        uint8_t length = 0;
        if (!Take(data, size, &offset, 2) || !Take(data, size, &length, 1)) break;
        const size_t at = offset % bytes;
        const size_t n = std::min<size_t>({length, size, bytes - at});
        std::memcpy(shared + at, data, n);
        data += n;
        size -= n;
        break;
      }
      case 5:
        if ((*daemon)->PrepareToSleep()) (*daemon)->ClearWakeups();
        break;
    }
  }
  munmap(map, bytes);
  return 0;
}
