#include "common/logging.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>

namespace ferry {
namespace logging_internal {

LogMessage::LogMessage(Severity severity, const char* file, int line) {
  const char* base = strrchr(file, '/');
  stream_ << '<' << static_cast<int>(severity) << '>' << (base ? base + 1 : file) << ':' << line
          << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string text = stream_.str();
  ssize_t unused = ::write(STDERR_FILENO, text.data(), text.size());
  (void)unused;
}

bool ShouldLogAgain(std::atomic<int64_t>* last, int seconds) {
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t seen = last->load(std::memory_order_relaxed);
  if (seen != 0 && now - seen < int64_t{seconds} * 1000000000) return false;
  return last->compare_exchange_strong(seen, now, std::memory_order_relaxed);
}

}  // namespace logging_internal
}  // namespace ferry
