// libFuzzer harness: ferryd's config file (protobuf text format) through LoadConfig, which
// parses, checks and fills the defaults. Any file loads or is refused with a status.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "server/service/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_create("ferryd.conf", MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (size > 0 && write(fd, data, size) != static_cast<ssize_t>(size)) {
    close(fd);
    return 0;
  }
  (void)ferry::LoadConfig("/proc/self/fd/" + std::to_string(fd));
  close(fd);
  return 0;
}
