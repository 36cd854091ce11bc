#include "common/logging.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ferry {
namespace {

// -1 until the first line decides (StderrIsJournal), then 0 or 1.
std::atomic<int> timestamps{-1};

bool Timestamps() {
  int on = timestamps.load(std::memory_order_relaxed);
  if (on < 0) {
    int expected = -1;
    timestamps.compare_exchange_strong(expected, StderrIsJournal() ? 0 : 1);
    on = timestamps.load(std::memory_order_relaxed);
  }
  return on == 1;
}

const char* SeverityName(LogSeverity severity) {
  switch (severity) {
    case LogSeverity::kDebug:
      return "DEBUG";
    case LogSeverity::kInfo:
      return "INFO";
    case LogSeverity::kWarning:
      return "WARNING";
    case LogSeverity::kError:
      return "ERROR";
  }
  return "?";
}

}  // namespace

absl::StatusOr<LogSeverity> ParseLogSeverity(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "debug") return LogSeverity::kDebug;
  if (lower == "info") return LogSeverity::kInfo;
  if (lower == "warning") return LogSeverity::kWarning;
  if (lower == "error") return LogSeverity::kError;
  return absl::InvalidArgumentError(absl::StrCat("log level '", name.substr(0, 64),
                                                 "' is not one of debug, info, warning, error"));
}

void SetLogLevel(LogSeverity least) {
  logging_internal::least_severity.store(static_cast<int>(least), std::memory_order_relaxed);
}

LogSeverity LogLevel() {
  return static_cast<LogSeverity>(logging_internal::least_severity.load(std::memory_order_relaxed));
}

void SetLogTimestamps(bool on) { timestamps.store(on ? 1 : 0, std::memory_order_relaxed); }

bool StderrIsJournal() {
  const char* stream = getenv("JOURNAL_STREAM");
  if (stream == nullptr) return false;
  std::pair<std::string, std::string> parts = absl::StrSplit(stream, ':');
  uint64_t device = 0, inode = 0;
  if (!absl::SimpleAtoi(parts.first, &device) || !absl::SimpleAtoi(parts.second, &inode)) {
    return false;
  }
  struct stat st;
  if (fstat(STDERR_FILENO, &st) != 0) return false;
  return static_cast<uint64_t>(st.st_dev) == device && static_cast<uint64_t>(st.st_ino) == inode;
}

namespace logging_internal {

std::string FormatLine(Severity severity, const char* file, int line, absl::string_view text,
                       bool with_time, absl::Time now) {
  const char* base = strrchr(file, '/');
  base = base ? base + 1 : file;
  if (with_time) {
    return absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", now, absl::UTCTimeZone()), " ",
                        SeverityName(severity), " ", base, ":", line, "] ", text, "\n");
  }
  return absl::StrCat("<", static_cast<int>(severity), ">", base, ":", line, "] ", text, "\n");
}

LogMessage::LogMessage(Severity severity, const char* file, int line)
    : severity_(severity), file_(file), line_(line) {}

LogMessage::~LogMessage() {
  const std::string text =
      FormatLine(severity_, file_, line_, stream_.str(), Timestamps(), absl::Now());
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
