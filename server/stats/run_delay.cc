#include "server/stats/run_delay.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ferry {

absl::StatusOr<absl::Duration> ParseSchedstatRunDelay(absl::string_view text) {
  const std::vector<absl::string_view> fields =
      absl::StrSplit(text, absl::ByAnyChar(" \n"), absl::SkipEmpty());
  uint64_t nanos = 0;
  if (fields.size() < 2 || !absl::SimpleAtoi(fields[1], &nanos)) {
    return absl::DataLossError(absl::StrCat("unreadable schedstat \"", text, "\""));
  }
  return absl::Nanoseconds(nanos);
}

absl::StatusOr<absl::Duration> MainThreadRunDelay(int pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/schedstat");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return err == ENOENT && ::access(absl::StrCat("/proc/", pid).c_str(), F_OK) == 0
               ? absl::UnavailableError(absl::StrCat(path,
                                                     " does not exist: the kernel keeps no "
                                                     "scheduler statistics (CONFIG_SCHED_INFO)"))
           : err == ENOENT ? absl::NotFoundError(absl::StrCat("no process ", pid))
                           : absl::UnavailableError(absl::StrCat(path, ": ", std::strerror(err)));
  }
  char buf[128];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  const int err = errno;
  ::close(fd);
  if (n < 0) {
    // ESRCH: the process exited between the open and the read.
    return err == ESRCH ? absl::NotFoundError(absl::StrCat("no process ", pid))
                        : absl::UnavailableError(absl::StrCat(path, ": ", std::strerror(err)));
  }
  return ParseSchedstatRunDelay(absl::string_view(buf, static_cast<size_t>(n)));
}

}  // namespace ferry
