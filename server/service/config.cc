#include "server/service/config.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/session_protocol.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "server/metrics/metrics_address.h"
#include "server/service/job_manager.h"
#include "server/service/session_server.h"
#include "server/transport/gather_options.h"

namespace ferry {
namespace {

class ErrorCollector final : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty())
      first_ = absl::StrCat("line ", line + 1, ", column ", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

uint64_t PhysicalMemoryBytes() {
  return static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
         static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

void ApplyDefaults(ferry::v1::DaemonConfig* c) {
  if (c->unix_socket().empty()) c->set_unix_socket(DefaultSocketPath());
  if (c->host_memory_budget_bytes() == 0)
    c->set_host_memory_budget_bytes(PhysicalMemoryBytes() / 2);
  if (c->pinned_memory_budget_bytes() == 0) {
    c->set_pinned_memory_budget_bytes(c->host_memory_budget_bytes());
  }
  if (c->sysfs_root().empty()) c->set_sysfs_root("/sys");
  if (c->log_level().empty()) c->set_log_level("info");
  // Settings that configure a struct of their own take that struct's defaults.
  const JobManager::Options jobs;
  const GatherOptions gather;
  if (c->default_prefetch_depth() == 0) c->set_default_prefetch_depth(jobs.default_prefetch_depth);
  if (c->default_prefetch_bytes() == 0) c->set_default_prefetch_bytes(jobs.default_prefetch_bytes);
  if (c->drain_timeout_seconds() == 0) c->set_drain_timeout_seconds(5);
  if (c->read_retry_seconds() == 0) {
    c->set_read_retry_seconds(
        static_cast<uint32_t>(absl::ToInt64Seconds(jobs.transient_retry_limit)));
  }
  const SessionLimits sessions;
  if (c->max_sessions() == 0) c->set_max_sessions(static_cast<uint32_t>(sessions.max_sessions));
  if (c->max_sessions_per_uid() == 0) {
    c->set_max_sessions_per_uid(static_cast<uint32_t>(sessions.max_sessions_per_uid));
  }
  if (!c->has_session_idle_timeout_seconds()) {
    c->set_session_idle_timeout_seconds(
        static_cast<uint32_t>(absl::ToInt64Seconds(sessions.idle_timeout)));
  }
  if (c->gather_thread_blocks() == 0) {
    c->set_gather_thread_blocks(static_cast<uint32_t>(gather.thread_blocks));
  }
  if (c->gather_streams() == 0) c->set_gather_streams(static_cast<uint32_t>(gather.streams));
  if (c->gather_registration_wait_ms() == 0) {
    c->set_gather_registration_wait_ms(
        static_cast<int32_t>(absl::ToInt64Milliseconds(gather.registration_wait)));
  }
  if (c->max_jobs_per_uid() == 0) c->set_max_jobs_per_uid(jobs.max_jobs_per_uid);
  if (!c->has_job_idle_timeout_seconds()) {
    c->set_job_idle_timeout_seconds(
        static_cast<uint32_t>(absl::ToInt64Seconds(jobs.job_idle_timeout)));
  }
}

std::string ImplicitConfigPath(bool listen_given, unsigned euid) {
  return !listen_given && IsSystemDaemonUid(euid) ? kDefaultConfigPath : "";
}

absl::StatusOr<LoadedConfig> LoadConfig(const std::string& path, const std::string& implicit_path) {
  LoadedConfig loaded;
  loaded.path = path.empty() ? implicit_path : path;
  std::ifstream in;
  if (!loaded.path.empty()) in.open(loaded.path);
  if (!in.is_open()) {
    if (!path.empty()) {
      return absl::NotFoundError(absl::StrCat("config file '", path,
                                              "' cannot be read; fix the path given to --config "
                                              "or leave it out to use the built-in defaults"));
    }
  } else {
    std::stringstream text;
    text << in.rdbuf();
    google::protobuf::TextFormat::Parser parser;
    ErrorCollector errors;
    parser.RecordErrorsTo(&errors);
    if (!parser.ParseFromString(text.str(), &loaded.config)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config file '", loaded.path, "', ", errors.first(), "; see deploy/ferryd.conf.example"));
    }
    loaded.from_file = true;
  }
  if (loaded.config.gather_streams() > kMaxGatherStreams) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config file '", loaded.path, "': gather_streams is ", loaded.config.gather_streams(),
        "; use 1 to ", kMaxGatherStreams, " (0 = the default, ", GatherOptions{}.streams, ")"));
  }
  if (loaded.config.has_worker_nice() &&
      (loaded.config.worker_nice() < 0 || loaded.config.worker_nice() > 19)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config file '", loaded.path, "': worker_nice is ", loaded.config.worker_nice(),
        "; use 0 (no change) to 19 (the lowest priority): ferryd cannot raise its "
        "workers above the trainers"));
  }
  for (const std::string& root : loaded.config.dataset_roots()) {
    if (root.empty() || root[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("config file '", loaded.path, "': dataset_roots entry '",
                       root.substr(0, 512), "' is not an absolute path; write it from /"));
    }
  }
  if (!loaded.config.log_level().empty()) {
    absl::StatusOr<LogSeverity> level = ParseLogSeverity(loaded.config.log_level());
    if (!level.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config file '", loaded.path, "': log_level: ", level.status().message()));
    }
  }
  const std::string& gpu_decode = loaded.config.gpu_decode();
  if (!gpu_decode.empty() && gpu_decode != "auto" && gpu_decode != "gpu" && gpu_decode != "cpu") {
    return absl::InvalidArgumentError(absl::StrCat("config file '", loaded.path,
                                                   "': gpu_decode must be \"auto\", \"gpu\" or "
                                                   "\"cpu\" (got \"",
                                                   gpu_decode.substr(0, 64), "\")"));
  }
  if (!loaded.config.metrics_listen().empty()) {
    absl::StatusOr<MetricsAddress> address = ParseMetricsAddress(loaded.config.metrics_listen());
    if (!address.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config file '", loaded.path, "': ", address.status().message()));
    }
    // The endpoint has no authentication: other machines reach it only when asked for.
    if (!address->loopback && !loaded.config.metrics_allow_non_loopback()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config file '", loaded.path, "': metrics_listen '", loaded.config.metrics_listen(),
          "' is not a loopback address, and the metrics endpoint has no authentication; use "
          "127.0.0.1:PORT, [::1]:PORT or unix:/PATH, or set metrics_allow_non_loopback: true "
          "to serve metrics to other machines"));
    }
  }
  ApplyDefaults(&loaded.config);
  return loaded;
}

}  // namespace ferry
