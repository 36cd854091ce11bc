// Loading ferryd's config file: defaults, parse errors and out-of-range settings.
#include "server/service/config.h"

#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/session_protocol.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = "/tmp/ferry-config-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    unlink(path().c_str());
    rmdir(dir_.c_str());
  }
  std::string path() const { return dir_ + "/ferryd.conf"; }
  void Write(const std::string& text) {
    std::ofstream out(path());
    out << text;
  }

  std::string dir_;
};

TEST_F(ConfigTest, FillsDefaultsAroundWhatTheFileSets) {
  Write("gather_streams: 3\ngather_thread_blocks: 32\n");
  absl::StatusOr<LoadedConfig> loaded = LoadConfig(path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->from_file);
  EXPECT_EQ(loaded->config.gather_streams(), 3u);
  EXPECT_EQ(loaded->config.gather_thread_blocks(), 32u);
  EXPECT_EQ(loaded->config.default_prefetch_depth(), 4u);
  EXPECT_EQ(loaded->config.gather_registration_wait_ms(), 1000);
  EXPECT_FALSE(loaded->config.unix_socket().empty());
}

TEST_F(ConfigTest, GatherSettingsDefaultToWhatTheDocsSay) {
  Write("");
  absl::StatusOr<LoadedConfig> loaded = LoadConfig(path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->config.gather_streams(), 4u);
  EXPECT_EQ(loaded->config.gather_thread_blocks(), 16u);
  EXPECT_EQ(loaded->config.gather_registration_wait_ms(), 1000);
  EXPECT_FALSE(loaded->config.gather_every_batch());
}

TEST_F(ConfigTest, MissingFileGivenExplicitlyIsAnError) {
  absl::StatusOr<LoadedConfig> loaded = LoadConfig(dir_ + "/absent.conf");
  ASSERT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(loaded.status().message(), "absent.conf"));
}

TEST_F(ConfigTest, AnImplicitFileIsReadWhenPresentAndSkippedWhenAbsent) {
  Write("workers_per_node: 3\n");
  absl::StatusOr<LoadedConfig> loaded = LoadConfig("", path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->from_file);
  EXPECT_EQ(loaded->config.workers_per_node(), 3u);
  loaded = LoadConfig("", dir_ + "/absent.conf");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->from_file);
  loaded = LoadConfig("", "");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->from_file);
  EXPECT_EQ(loaded->config.workers_per_node(), 0u);
}

TEST_F(ConfigTest, WorkerNiceOutsideZeroToNineteenIsRefused) {
  Write("worker_nice: 19\n");
  absl::StatusOr<LoadedConfig> loaded = LoadConfig(path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->config.worker_nice(), 19);
  for (const char* text : {"worker_nice: -5\n", "worker_nice: 20\n"}) {
    Write(text);
    loaded = LoadConfig(path());
    ASSERT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_TRUE(absl::StrContains(loaded.status().message(), "worker_nice is")) << text;
    EXPECT_TRUE(absl::StrContains(loaded.status().message(), "use 0")) << text;
  }
}

// An installed package's /etc/ferry/ferryd.conf (dataset_roots, the system socket) must not
// reach a test's or a user's private ferryd: only the system daemon reads it implicitly.
TEST(ImplicitConfigPathTest, OnlyTheSystemDaemonReadsTheSystemConfig) {
  EXPECT_EQ(ImplicitConfigPath(/*listen_given=*/false, /*euid=*/0), kDefaultConfigPath);
  EXPECT_EQ(ImplicitConfigPath(/*listen_given=*/true, /*euid=*/0), "");
  if (!IsSystemDaemonUid(54321)) {
    EXPECT_EQ(ImplicitConfigPath(/*listen_given=*/false, /*euid=*/54321), "");
  }
  EXPECT_EQ(ImplicitConfigPath(/*listen_given=*/true, /*euid=*/54321), "");
}

TEST_F(ConfigTest, MalformedFileNamesTheFileAndTheProblem) {
  Write("gather_streams: three\n");
  absl::StatusOr<LoadedConfig> loaded = LoadConfig(path());
  ASSERT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(loaded.status().message(), path()));
  EXPECT_TRUE(absl::StrContains(loaded.status().message(), "line 1")) << loaded.status();
}

TEST_F(ConfigTest, GatherStreamsOverTheLimitIsRefusedWithTheRange) {
  const uint32_t over = kMaxGatherStreams + 1;
  Write(absl::StrCat("gather_streams: ", over, "\n"));
  absl::StatusOr<LoadedConfig> loaded = LoadConfig(path());
  ASSERT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      absl::StrContains(loaded.status().message(), absl::StrCat("gather_streams is ", over)))
      << loaded.status();
  EXPECT_TRUE(
      absl::StrContains(loaded.status().message(), absl::StrCat("1 to ", kMaxGatherStreams)));
  Write(absl::StrCat("gather_streams: ", kMaxGatherStreams, "\n"));
  EXPECT_TRUE(LoadConfig(path()).ok());
}

TEST_F(ConfigTest, HardeningSettingsDefaultToWhatTheDocsSay) {
  Write("");
  absl::StatusOr<LoadedConfig> loaded = LoadConfig(path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->config.read_retry_seconds(), 300u);
  EXPECT_EQ(loaded->config.max_sessions(), 4096u);
  EXPECT_EQ(loaded->config.max_sessions_per_uid(), 1024u);
  EXPECT_FALSE(loaded->config.follow_symlinks_within_roots());
  // Left at 0: the daemon picks 0660 for the system socket, 0600 for any other.
  EXPECT_EQ(loaded->config.unix_socket_mode(), 0u);
}

TEST_F(ConfigTest, RelativeDatasetRootsAreRefused) {
  Write("dataset_roots: \"/data\"\ndataset_roots: \"data/images\"\n");
  absl::StatusOr<LoadedConfig> loaded = LoadConfig(path());
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loaded.status().message()),
              ::testing::HasSubstr("dataset_roots entry 'data/images' is not an absolute path"));
}

TEST_F(ConfigTest, MetricsAreOffByDefaultAndTakeLoopbackOrUnixAddresses) {
  Write("");
  absl::StatusOr<LoadedConfig> loaded = LoadConfig(path());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->config.metrics_listen(), "");
  EXPECT_FALSE(loaded->config.metrics_allow_non_loopback());
  EXPECT_EQ(loaded->config.log_level(), "info");
  for (const char* address : {"127.0.0.1:9464", "[::1]:9464", "unix:/run/ferry/metrics.sock"}) {
    Write(absl::StrCat("metrics_listen: \"", address, "\"\n"));
    loaded = LoadConfig(path());
    ASSERT_TRUE(loaded.ok()) << address << ": " << loaded.status();
    EXPECT_EQ(loaded->config.metrics_listen(), address);
  }
}

TEST_F(ConfigTest, NonLoopbackMetricsAddressNeedsTheAllowSetting) {
  Write("metrics_listen: \"0.0.0.0:9464\"\n");
  absl::StatusOr<LoadedConfig> loaded = LoadConfig(path());
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loaded.status().message()),
              ::testing::AllOf(::testing::HasSubstr(path()),
                               ::testing::HasSubstr("metrics_listen '0.0.0.0:9464' is not a "
                                                    "loopback address"),
                               ::testing::HasSubstr("metrics_allow_non_loopback: true")));
  Write("metrics_listen: \"0.0.0.0:9464\"\nmetrics_allow_non_loopback: true\n");
  loaded = LoadConfig(path());
  EXPECT_TRUE(loaded.ok()) << loaded.status();
}

TEST_F(ConfigTest, MalformedMetricsAddressAndLogLevelAreRefused) {
  Write("metrics_listen: \"9464\"\n");
  absl::StatusOr<LoadedConfig> loaded = LoadConfig(path());
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loaded.status().message()),
              ::testing::HasSubstr("metrics_listen '9464' has no port"));
  Write("log_level: \"chatty\"\n");
  loaded = LoadConfig(path());
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loaded.status().message()),
              ::testing::HasSubstr("log_level: log level 'chatty' is not one of debug, info, "
                                   "warning, error"));
  Write("log_level: \"debug\"\n");
  EXPECT_TRUE(LoadConfig(path()).ok());
}

}  // namespace
}  // namespace ferry
