// Minimal logging to stderr, one line per message. Under journald (stderr is the journal
// stream: JOURNAL_STREAM, see systemd.exec(5)) a line is prefixed with the sd-daemon
// priority ("<4>" = warning) that journald parses, so `journalctl -p warning -u ferryd`
// filters correctly, and journald adds the time. Anywhere else a line starts with the UTC
// time (ISO 8601, milliseconds) and the severity's name. Debian's abseil (20220623) predates
// absl/log; this keeps ferry free of a second logging library for a few dozen log lines.
//
//   FERRY_LOG(WARNING) << "job " << id << " rank " << rank << ": skipped sample " << index;
//   FERRY_LOG(DEBUG) << ...;  // costs one atomic load unless the level is debug
//
//   SetLogLevel(LogSeverity::kWarning);  // ferryd --log-level warning
#ifndef FERRY_COMMON_LOGGING_H_
#define FERRY_COMMON_LOGGING_H_

#include <atomic>
#include <cstdint>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ferry {

// Values are the sd-daemon priorities; a smaller value is more severe.
enum class LogSeverity { kDebug = 7, kInfo = 6, kWarning = 4, kError = 3 };

// "debug", "info", "warning" or "error"; INVALID_ARGUMENT naming `name` and the four otherwise.
absl::StatusOr<LogSeverity> ParseLogSeverity(absl::string_view name);

// Messages less severe than `least` are dropped. Default: kInfo. Thread-safe.
void SetLogLevel(LogSeverity least);
LogSeverity LogLevel();

// Timestamps and severity names (true) or journald's "<N>" prefix (false). Default: true
// unless StderrIsJournal() when the first line is written. Thread-safe.
void SetLogTimestamps(bool on);

// True when JOURNAL_STREAM names the device and inode of this process's stderr.
bool StderrIsJournal();

namespace logging_internal {

using Severity = LogSeverity;

inline std::atomic<int> least_severity{static_cast<int>(LogSeverity::kInfo)};

inline bool Enabled(Severity severity) {
  return static_cast<int>(severity) <= least_severity.load(std::memory_order_relaxed);
}

// One line as written: "<6>file.cc:12] text\n" or "2024-05-01T12:00:00.123Z INFO file.cc:12]
// text\n".
std::string FormatLine(Severity severity, const char* file, int line, absl::string_view text,
                       bool timestamps, absl::Time now);

// Collects one message and writes it with a single write(2) on destruction, so lines from
// different threads never interleave.
class LogMessage {
 public:
  LogMessage(Severity severity, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  Severity severity_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

// Turns a streamed LogMessage into void, so FERRY_LOG can be the second operand of ?:.
struct Voidify {
  void operator&(std::ostream&) {}
};

// True when `seconds` have passed since the last time it returned true for `last` (the
// steady clock's nanoseconds of that time; 0 before the first).
bool ShouldLogAgain(std::atomic<int64_t>* last, int seconds);

}  // namespace logging_internal
}  // namespace ferry

#define FERRY_LOG_SEVERITY_DEBUG ::ferry::LogSeverity::kDebug
#define FERRY_LOG_SEVERITY_INFO ::ferry::LogSeverity::kInfo
#define FERRY_LOG_SEVERITY_WARNING ::ferry::LogSeverity::kWarning
#define FERRY_LOG_SEVERITY_ERROR ::ferry::LogSeverity::kError
#define FERRY_LOG(severity)                                                                \
  !::ferry::logging_internal::Enabled(FERRY_LOG_SEVERITY_##severity)                       \
      ? (void)0                                                                            \
      : ::ferry::logging_internal::Voidify() &                                             \
            ::ferry::logging_internal::LogMessage(FERRY_LOG_SEVERITY_##severity, __FILE__, \
                                                  __LINE__)                                \
                .stream()

// Logs at most once every `seconds` from this line: a flood of one event is one line.
#define FERRY_LOG_EVERY_N_SEC(severity, seconds)                              \
  if (static std::atomic<int64_t> ferry_log_last{0};                          \
      !::ferry::logging_internal::ShouldLogAgain(&ferry_log_last, seconds)) { \
  } else                                                                      \
    FERRY_LOG(severity)

#endif  // FERRY_COMMON_LOGGING_H_
