// Minimal logging to stderr, one line per message, prefixed with the sd-daemon priority
// ("<4>" = warning) that journald parses, so `journalctl -p warning -u ferryd` filters
// correctly. Debian's abseil (20220623) predates absl/log; this keeps ferry free of a
// second logging library for a few dozen log lines.
//
//   FERRY_LOG(WARNING) << "skipped sample " << index << ": " << status;
#ifndef FERRY_COMMON_LOGGING_H_
#define FERRY_COMMON_LOGGING_H_

#include <atomic>
#include <cstdint>
#include <sstream>

namespace ferry {
namespace logging_internal {

enum class Severity { kInfo = 6, kWarning = 4, kError = 3 };

// Collects one message and writes it with a single write(2) on destruction, so lines from
// different threads never interleave.
class LogMessage {
 public:
  LogMessage(Severity severity, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// True when `seconds` have passed since the last time it returned true for `last` (the
// steady clock's nanoseconds of that time; 0 before the first).
bool ShouldLogAgain(std::atomic<int64_t>* last, int seconds);

}  // namespace logging_internal
}  // namespace ferry

#define FERRY_LOG_SEVERITY_INFO ::ferry::logging_internal::Severity::kInfo
#define FERRY_LOG_SEVERITY_WARNING ::ferry::logging_internal::Severity::kWarning
#define FERRY_LOG_SEVERITY_ERROR ::ferry::logging_internal::Severity::kError
#define FERRY_LOG(severity) \
  ::ferry::logging_internal::LogMessage(FERRY_LOG_SEVERITY_##severity, __FILE__, __LINE__).stream()

// Logs at most once every `seconds` from this line: a flood of one event is one line.
#define FERRY_LOG_EVERY_N_SEC(severity, seconds)                              \
  if (static std::atomic<int64_t> ferry_log_last{0};                          \
      !::ferry::logging_internal::ShouldLogAgain(&ferry_log_last, seconds)) { \
  } else                                                                      \
    FERRY_LOG(severity)

#endif  // FERRY_COMMON_LOGGING_H_
