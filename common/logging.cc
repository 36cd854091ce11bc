#include "common/logging.h"

#include <unistd.h>

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

}  // namespace logging_internal
}  // namespace ferry
