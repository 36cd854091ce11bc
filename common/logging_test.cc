#include "common/logging.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

// Points stderr at a temporary file for its lifetime and restores the level, timestamps
// and stderr afterwards.
class CapturedStderr {
 public:
  CapturedStderr() {
    char path[] = "/tmp/ferry-logging-test-XXXXXX";
    fd_ = mkstemp(path);
    path_ = path;
    saved_ = dup(STDERR_FILENO);
    dup2(fd_, STDERR_FILENO);
    level_ = LogLevel();
  }
  ~CapturedStderr() {
    dup2(saved_, STDERR_FILENO);
    close(saved_);
    close(fd_);
    unlink(path_.c_str());
    SetLogLevel(level_);
    SetLogTimestamps(!StderrIsJournal());
  }
  std::string Text() const {
    std::ifstream in(path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  int saved_ = -1;
  std::string path_;
  LogSeverity level_;
};

TEST(LoggingTest, ParsesTheFourLevels) {
  EXPECT_EQ(*ParseLogSeverity("debug"), LogSeverity::kDebug);
  EXPECT_EQ(*ParseLogSeverity("info"), LogSeverity::kInfo);
  EXPECT_EQ(*ParseLogSeverity("WARNING"), LogSeverity::kWarning);
  EXPECT_EQ(*ParseLogSeverity("error"), LogSeverity::kError);
  auto bad = ParseLogSeverity("verbose");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "log level 'verbose' is not one of debug, info, warning, error");
}

TEST(LoggingTest, MessagesBelowTheLevelAreDroppedUnevaluated) {
  CapturedStderr captured;
  SetLogTimestamps(false);
  int evaluated = 0;
  auto count = [&evaluated] { return ++evaluated; };
  SetLogLevel(LogSeverity::kWarning);
  FERRY_LOG(DEBUG) << "debug line " << count();
  FERRY_LOG(INFO) << "info line " << count();
  FERRY_LOG(WARNING) << "warning line " << count();
  FERRY_LOG(ERROR) << "error line " << count();
  EXPECT_EQ(evaluated, 2);
  SetLogLevel(LogSeverity::kDebug);
  FERRY_LOG(DEBUG) << "debug shown";
  const std::string text = captured.Text();
  EXPECT_THAT(text, Not(HasSubstr("debug line")));
  EXPECT_THAT(text, Not(HasSubstr("info line")));
  EXPECT_THAT(text, HasSubstr("<4>logging_test.cc:"));
  EXPECT_THAT(text, HasSubstr("] warning line 1\n"));
  EXPECT_THAT(text, HasSubstr("<3>logging_test.cc:"));
  EXPECT_THAT(text, HasSubstr("<7>logging_test.cc:"));
  EXPECT_THAT(text, HasSubstr("] debug shown\n"));
}

TEST(LoggingTest, LinesCarryTheTimeUnlessJournaldAddsIt) {
  const absl::Time t = absl::FromUnixMillis(1714564800123);  // 2024-05-01T12:00:00.123Z
  EXPECT_EQ(logging_internal::FormatLine(LogSeverity::kWarning, "/src/server/x.cc", 12,
                                         "job j1 rank 0: slow", true, t),
            "2024-05-01T12:00:00.123Z WARNING x.cc:12] job j1 rank 0: slow\n");
  EXPECT_EQ(logging_internal::FormatLine(LogSeverity::kWarning, "/src/server/x.cc", 12,
                                         "job j1 rank 0: slow", false, t),
            "<4>x.cc:12] job j1 rank 0: slow\n");

  CapturedStderr captured;
  SetLogTimestamps(true);
  FERRY_LOG(INFO) << "stamped";
  EXPECT_THAT(captured.Text(),
              MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "
                           "INFO logging_test\\.cc:[0-9]+\\] stamped\n"));
}

TEST(LoggingTest, StderrIsTheJournalOnlyWhenJournalStreamNamesIt) {
  CapturedStderr captured;
  struct stat st;
  ASSERT_EQ(fstat(captured.fd(), &st), 0);
  const char* before = getenv("JOURNAL_STREAM");
  const std::string saved = before ? before : "";
  unsetenv("JOURNAL_STREAM");
  EXPECT_FALSE(StderrIsJournal());
  setenv("JOURNAL_STREAM", absl::StrCat(st.st_dev, ":", st.st_ino).c_str(), 1);
  EXPECT_TRUE(StderrIsJournal());
  // Inherited by a process whose stderr went elsewhere (a shell under the unit, a pipe).
  setenv("JOURNAL_STREAM", absl::StrCat(st.st_dev, ":", st.st_ino + 1).c_str(), 1);
  EXPECT_FALSE(StderrIsJournal());
  setenv("JOURNAL_STREAM", "garbage", 1);
  EXPECT_FALSE(StderrIsJournal());
  if (before) {
    setenv("JOURNAL_STREAM", saved.c_str(), 1);
  } else {
    unsetenv("JOURNAL_STREAM");
  }
}

}  // namespace
}  // namespace ferry
