// Minimal logging to stderr, one line per message, prefixed with the sd-daemon priority
// ("<4>" = warning) that journald parses, so `journalctl -p warning -u ferryd` filters
// correctly. Debian's abseil (20220623) predates absl/log; this keeps ferry free of a
// second logging library for a few dozen log lines.
//
//   FERRY_LOG(WARNING) << "skipped sample " << index << ": " << status;
#ifndef FERRY_COMMON_LOGGING_H_
#define FERRY_COMMON_LOGGING_H_

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

}  // namespace logging_internal
}  // namespace ferry

#define FERRY_LOG_SEVERITY_INFO ::ferry::logging_internal::Severity::kInfo
#define FERRY_LOG_SEVERITY_WARNING ::ferry::logging_internal::Severity::kWarning
#define FERRY_LOG_SEVERITY_ERROR ::ferry::logging_internal::Severity::kError
#define FERRY_LOG(severity) \
  ::ferry::logging_internal::LogMessage(FERRY_LOG_SEVERITY_##severity, __FILE__, __LINE__).stream()

#endif  // FERRY_COMMON_LOGGING_H_
