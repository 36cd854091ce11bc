#include "server/metrics/prometheus_text.h"

#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

ferry::v1::GetStatusResponse SampleStatus() {
  ferry::v1::GetStatusResponse status;
  ferry::v1::DaemonStatus* d = status.mutable_daemon();
  d->set_version("0.1.0");
  d->set_uptime_seconds(12.5);
  d->set_cpu_seconds(3.25);
  d->set_workers(8);
  d->set_workers_busy_fraction(0.75);
  d->set_host_memory_in_use_bytes(1 << 20);
  d->set_host_memory_budget_bytes(uint64_t{8} << 30);
  d->set_pinned_memory_in_use_bytes(4096);
  d->set_pinned_memory_budget_bytes(uint64_t{8} << 30);
  ferry::v1::RemoteStatus* remote = d->mutable_remote();
  remote->set_cache_bytes(uint64_t{3} << 30);
  remote->set_cache_capacity_bytes(uint64_t{100} << 30);
  remote->set_cache_entries(40);
  remote->set_cache_pinned_entries(2);
  remote->set_cache_hits(900);
  remote->set_cache_misses(40);
  remote->set_downloaded_bytes(uint64_t{3} << 30);
  remote->set_requests(85);
  remote->set_requests_in_flight(3);
  for (const char* cause : {"connection", "throttled", "server", "short"}) {
    ferry::v1::ReasonCount* retries = remote->add_retries();
    retries->set_reason(cause);
    retries->set_count(cause[0] == 't' ? 4 : 0);
  }
  d->set_consumers(2);
  ferry::v1::GpuStatus* gpu = d->add_gpus();
  gpu->set_ordinal(1);
  gpu->set_name("NVIDIA H100");
  gpu->set_pci_bus_id("0000:17:00.0");
  gpu->set_bytes_to_device(1234567890123);
  gpu->set_device_memory_in_use_bytes(100);
  gpu->set_device_memory_budget_bytes(1000);

  ferry::v1::JobStatus* job = status.add_jobs();
  job->mutable_job()->set_id("j0123456789ab");
  job->mutable_job()->set_name("imagenet \"train\"\\x\n");
  job->mutable_job()->set_owner_uid(1000);
  job->mutable_job()->mutable_spec()->set_device("cuda:1");
  job->set_samples_decoded(640);
  job->set_bytes_read(99);
  ferry::v1::BlendSourceStatus* wiki = job->add_blend_sources();
  wiki->set_name("wiki");
  wiki->set_samples_drawn(77);
  ferry::v1::GpuDecodeStatus* gpu_decode = job->mutable_gpu_decode();
  gpu_decode->set_mode("auto");
  gpu_decode->set_gpu_images(120345);
  gpu_decode->set_cpu_images(30100);
  for (const auto& [reason, count] :
       std::vector<std::pair<std::string, int64_t>>{{"progressive", 812}, {"not_jpeg", 2}}) {
    ferry::v1::ReasonCount* f = gpu_decode->add_fallbacks();
    f->set_reason(reason);
    f->set_count(count);
  }
  ferry::v1::ReasonCount* future = gpu_decode->add_fallbacks();
  future->set_reason("later_reason");
  future->set_count(4);
  gpu_decode->set_gpu_share(0.8125);
  gpu_decode->set_search_offset(-0.125);
  ferry::v1::ReadAheadStatus* ahead = job->mutable_read_ahead();
  ahead->set_opened(1200);
  ahead->set_failed(1);
  ahead->set_skipped(30);
  ahead->set_files_in_window(256);
  ahead->set_bytes_in_window(uint64_t{3} << 30);
  ferry::v1::ReasonCount* corrupt = job->add_errors_by_reason();
  corrupt->set_reason("corrupt");
  corrupt->set_count(3);
  ferry::v1::ReasonCount* odd = job->add_errors_by_reason();
  odd->set_reason("later_reason");
  odd->set_count(1);
  for (uint32_t r = 0; r < 2; ++r) {
    ferry::v1::RankStatus* rank = job->add_ranks();
    rank->set_rank(r);
    rank->set_attached(true);
    rank->set_batches_delivered(10 + r);
    rank->set_samples_delivered(320 + 32 * r);
    rank->set_stall_ratio(0.25);
    rank->set_limiting_stage(r == 0 ? ferry::v1::LIMITED_BY_DECODE : ferry::v1::LIMITED_BY_TRAINER);
    ferry::v1::Histogram* h = rank->mutable_handoff_latency();
    h->add_bounds(0.001);
    h->add_bounds(0.01);
    h->add_counts(2);
    h->add_counts(3);
    h->add_counts(1);
    h->set_sum(0.125);
    h->set_count(6);
  }
  return status;
}

// Family name -> type, from the # TYPE lines; fails on a family declared twice or a TYPE
// without the HELP line just before it.
std::map<std::string, std::string> Families(const std::string& text) {
  std::map<std::string, std::string> families;
  std::istringstream in(text);
  std::string line, previous;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream words(line.substr(7));
      std::string name, type;
      words >> name >> type;
      EXPECT_EQ(previous.rfind("# HELP " + name + " ", 0), 0u) << line;
      EXPECT_TRUE(families.emplace(name, type).second) << "declared twice: " << name;
    }
    previous = line;
  }
  return families;
}

TEST(PrometheusTextTest, EverySampleIsWellFormedAndFollowsItsFamily) {
  const std::string text = StatusToPrometheus(SampleStatus());
  const std::regex sample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? )"
      R"(([-+]?[0-9.e+-]+|\+Inf|-Inf|NaN)$)");
  std::istringstream in(text);
  std::string line, family;
  std::set<std::string> seen;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      family = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_TRUE(seen.insert(family).second) << "samples of " << family << " are split";
      continue;
    }
    if (line.rfind("#", 0) == 0) continue;
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, sample)) << line;
    const std::string name = m[1];
    EXPECT_TRUE(name == family || name == family + "_bucket" || name == family + "_sum" ||
                name == family + "_count")
        << name << " under family " << family;
    EXPECT_EQ(name.rfind("ferry_", 0), 0u) << name;
  }
}

TEST(PrometheusTextTest, FamiliesHaveConventionalNamesAndTypes) {
  const auto families = Families(StatusToPrometheus(SampleStatus()));
  for (const auto& [name, type] : families) {
    const bool total = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
    EXPECT_EQ(total, type == "counter") << name << " is a " << type;
    EXPECT_THAT(type, testing::AnyOf("counter", "gauge", "histogram")) << name;
  }
  const std::map<std::string, std::string> expected = {
      {"ferry_build_info", "gauge"},
      {"ferry_uptime_seconds", "gauge"},
      {"ferry_cpu_seconds_total", "counter"},
      {"ferry_workers_busy_ratio", "gauge"},
      {"ferry_memory_in_use_bytes", "gauge"},
      {"ferry_memory_budget_bytes", "gauge"},
      {"ferry_gpu_device_memory_in_use_bytes", "gauge"},
      {"ferry_gpu_device_memory_budget_bytes", "gauge"},
      {"ferry_gpu_h2d_bytes_total", "counter"},
      {"ferry_job_samples_decoded_total", "counter"},
      {"ferry_job_read_bytes_total", "counter"},
      {"ferry_job_bad_samples_total", "counter"},
      {"ferry_job_blend_source_samples_drawn_total", "counter"},
      {"ferry_job_gpu_decode_images_total", "counter"},
      {"ferry_job_gpu_decode_fallbacks_total", "counter"},
      {"ferry_job_gpu_decode_share", "gauge"},
      {"ferry_job_gpu_decode_search_offset", "gauge"},
      {"ferry_rank_batches_delivered_total", "counter"},
      {"ferry_rank_samples_delivered_total", "counter"},
      {"ferry_rank_stall_ratio", "gauge"},
      {"ferry_rank_queue_depth", "gauge"},
      {"ferry_rank_limiting_stage", "gauge"},
      {"ferry_rank_handoff_latency_seconds", "histogram"},
      {"ferry_rank_copy_latency_seconds", "histogram"},
  };
  for (const auto& [name, type] : expected) {
    auto it = families.find(name);
    ASSERT_NE(it, families.end()) << name;
    EXPECT_EQ(it->second, type) << name;
  }
}

TEST(PrometheusTextTest, WithoutJobsEveryFamilyIsStillDeclared) {
  ferry::v1::GetStatusResponse empty;
  empty.mutable_daemon()->set_version("0.1.0");
  empty.mutable_daemon()->mutable_remote();  // remote datasets configured, nothing read yet
  const std::string text = StatusToPrometheus(empty);
  EXPECT_EQ(Families(text), Families(StatusToPrometheus(SampleStatus())));
  EXPECT_THAT(text, Not(HasSubstr("ferry_rank_batches_delivered_total{")));
  EXPECT_THAT(text, HasSubstr("\nferry_jobs 0\n"));
}

TEST(PrometheusTextTest, RankSeriesCarryJobAndRankLabels) {
  const std::string text = StatusToPrometheus(SampleStatus());
  const std::string job = R"(job_id="j0123456789ab",job_name="imagenet \"train\"\\x\n")";
  EXPECT_THAT(text, HasSubstr("ferry_rank_batches_delivered_total{" + job + ",rank=\"0\"} 10\n"));
  EXPECT_THAT(text, HasSubstr("ferry_rank_batches_delivered_total{" + job + ",rank=\"1\"} 11\n"));
  EXPECT_THAT(text, HasSubstr("ferry_rank_samples_delivered_total{" + job + ",rank=\"1\"} 352\n"));
  EXPECT_THAT(text, HasSubstr("ferry_rank_stall_ratio{" + job + ",rank=\"0\"} 0.25\n"));
  EXPECT_THAT(text, HasSubstr("ferry_job_samples_decoded_total{" + job + "} 640\n"));
  EXPECT_THAT(text,
              HasSubstr("ferry_job_info{" + job + ",device=\"cuda:1\",owner_uid=\"1000\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ferry_gpu_h2d_bytes_total{gpu=\"1\"} 1234567890123\n"));
  EXPECT_THAT(text, HasSubstr("ferry_memory_budget_bytes{pool=\"host\"} 8589934592\n"));
  EXPECT_THAT(text, HasSubstr("ferry_build_info{version=\"0.1.0\"} 1\n"));
  // The scrape target's `job` label is Prometheus' own.
  EXPECT_THAT(text, Not(HasSubstr("{job=")));
}

TEST(PrometheusTextTest, RemoteReadsExportTheCacheAndTheTransfers) {
  const std::string text = StatusToPrometheus(SampleStatus());
  EXPECT_THAT(text, HasSubstr("\nferry_remote_cache_bytes 3221225472\n"));
  EXPECT_THAT(text, HasSubstr("\nferry_remote_cache_entries{state=\"pinned\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("\nferry_remote_cache_lookups_total{result=\"hit\"} 900\n"));
  EXPECT_THAT(text, HasSubstr("\nferry_remote_retries_total{cause=\"throttled\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("\nferry_remote_requests_in_flight 3\n"));
  ferry::v1::GetStatusResponse local = SampleStatus();
  local.mutable_daemon()->clear_remote();
  EXPECT_THAT(StatusToPrometheus(local), Not(HasSubstr("ferry_remote_")))
      << "no remote families from a ferryd that reads no remote datasets";
}

TEST(PrometheusTextTest, BadSamplesByReasonExportTheFixedReasonsAndNewOnes) {
  const std::string text = StatusToPrometheus(SampleStatus());
  const std::string job =
      R"(ferry_job_bad_samples_total{job_id="j0123456789ab",job_name="imagenet \"train\"\\x\n",reason=)";
  EXPECT_THAT(text, HasSubstr(job + "\"corrupt\"} 3\n"));
  for (const char* zero : {"missing", "unreadable", "too_large", "other"}) {
    EXPECT_THAT(text, HasSubstr(job + "\"" + zero + "\"} 0\n"));
  }
  EXPECT_THAT(text, HasSubstr(job + "\"later_reason\"} 1\n"));
}

TEST(PrometheusTextTest, BlendSourcesExportSamplesReadBySource) {
  EXPECT_THAT(
      StatusToPrometheus(SampleStatus()),
      HasSubstr(
          R"(ferry_job_blend_source_samples_drawn_total{job_id="j0123456789ab",job_name="imagenet \"train\"\\x\n",source="wiki"} 77)"
          "\n"));
}

TEST(PrometheusTextTest, GpuDecodeExportsImagesByDecoderFallbacksAndShare) {
  const std::string text = StatusToPrometheus(SampleStatus());
  const std::string job = R"(job_id="j0123456789ab",job_name="imagenet \"train\"\\x\n")";
  EXPECT_THAT(text, HasSubstr("ferry_job_gpu_decode_images_total{" + job +
                              ",decoder=\"gpu\"} 120345\n"
                              "ferry_job_gpu_decode_images_total{" +
                              job + ",decoder=\"cpu\"} 30100\n"));
  const std::string fallbacks = "ferry_job_gpu_decode_fallbacks_total{" + job + ",reason=";
  EXPECT_THAT(text, HasSubstr(fallbacks + "\"progressive\"} 812\n"));
  EXPECT_THAT(text, HasSubstr(fallbacks + "\"not_jpeg\"} 2\n"));
  for (const char* zero : {"corrupt", "unsupported_coding", "unsupported_subsampling", "cmyk",
                           "unsupported_color_space", "too_large", "decoder_refused"}) {
    EXPECT_THAT(text, HasSubstr(fallbacks + "\"" + zero + "\"} 0\n"));
  }
  EXPECT_THAT(text, HasSubstr(fallbacks + "\"later_reason\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("ferry_job_gpu_decode_share{" + job + "} 0.8125\n"));
  EXPECT_THAT(text, HasSubstr("ferry_job_gpu_decode_search_offset{" + job + "} -0.125\n"));

  // A job whose GPU decodes no JPEGs has none of these series; its families stay declared.
  ferry::v1::GetStatusResponse off = SampleStatus();
  off.mutable_jobs(0)->mutable_gpu_decode()->Clear();
  off.mutable_jobs(0)->mutable_gpu_decode()->set_off("GPU JPEG decode is off: no libnvjpeg");
  const std::string off_text = StatusToPrometheus(off);
  EXPECT_THAT(off_text, HasSubstr("# TYPE ferry_job_gpu_decode_share gauge\n"));
  EXPECT_THAT(off_text, Not(HasSubstr("ferry_job_gpu_decode_share{")));
  EXPECT_THAT(off_text, Not(HasSubstr("ferry_job_gpu_decode_images_total{")));
  EXPECT_THAT(off_text, Not(HasSubstr("ferry_job_gpu_decode_fallbacks_total{")));
}

TEST(PrometheusTextTest, ReadAheadExportsFilesByOutcomeAndTheWindow) {
  const std::string text = StatusToPrometheus(SampleStatus());
  const std::string job = R"(job_id="j0123456789ab",job_name="imagenet \"train\"\\x\n")";
  const std::string files = "ferry_job_read_ahead_files_total{" + job + ",outcome=";
  EXPECT_THAT(text, HasSubstr(files + "\"opened\"} 1200\n" + files + "\"failed\"} 1\n" + files +
                              "\"skipped\"} 30\n"));
  EXPECT_THAT(text, HasSubstr("ferry_job_read_ahead_window_files{" + job + "} 256\n"));
  EXPECT_THAT(text, HasSubstr("ferry_job_read_ahead_window_bytes{" + job + "} 3221225472\n"));
  // A job that reads nothing ahead has none of these series.
  ferry::v1::GetStatusResponse local = SampleStatus();
  local.mutable_jobs(0)->clear_read_ahead();
  const std::string local_text = StatusToPrometheus(local);
  EXPECT_THAT(local_text, HasSubstr("# TYPE ferry_job_read_ahead_files_total counter\n"));
  EXPECT_THAT(local_text, Not(HasSubstr("ferry_job_read_ahead_files_total{")));
  EXPECT_THAT(local_text, Not(HasSubstr("ferry_job_read_ahead_window_bytes{")));
}

TEST(PrometheusTextTest, LimitingStageIsAStateSetWithOneCurrentStage) {
  const std::string text = StatusToPrometheus(SampleStatus());
  for (const std::string rank : {"0", "1"}) {
    const std::string current = rank == "0" ? "decode" : "trainer";
    int ones = 0;
    for (const char* stage : {"unknown", "trainer", "read", "decode", "copy"}) {
      const std::string prefix = "ferry_rank_limiting_stage{job_id=\"j0123456789ab\",";
      const std::regex line("ferry_rank_limiting_stage\\{[^}]*rank=\"" + rank + "\",stage=\"" +
                            stage + "\"\\} ([01])");
      std::smatch m;
      ASSERT_TRUE(std::regex_search(text, m, line)) << rank << " " << stage;
      EXPECT_EQ(m[1], stage == current ? "1" : "0") << rank << " " << stage;
      ones += m[1] == "1";
    }
    EXPECT_EQ(ones, 1);
  }
}

TEST(PrometheusTextTest, HistogramBucketsAreCumulative) {
  const std::string text = StatusToPrometheus(SampleStatus());
  const std::string r0 = R"(job_id="j0123456789ab",job_name="imagenet \"train\"\\x\n",rank="0")";
  EXPECT_THAT(text, HasSubstr("ferry_rank_handoff_latency_seconds_bucket{" + r0 +
                              ",le=\"0.001\"} 2\n"
                              "ferry_rank_handoff_latency_seconds_bucket{" +
                              r0 +
                              ",le=\"0.01\"} 5\n"
                              "ferry_rank_handoff_latency_seconds_bucket{" +
                              r0 +
                              ",le=\"+Inf\"} 6\n"
                              "ferry_rank_handoff_latency_seconds_sum{" +
                              r0 +
                              "} 0.125\n"
                              "ferry_rank_handoff_latency_seconds_count{" +
                              r0 + "} 6\n"));
  // An empty histogram (the host transport's copy latency) is the +Inf bucket alone.
  EXPECT_THAT(text, HasSubstr("ferry_rank_copy_latency_seconds_bucket{" + r0 +
                              ",le=\"+Inf\"} 0\n"
                              "ferry_rank_copy_latency_seconds_sum{" +
                              r0 +
                              "} 0\n"
                              "ferry_rank_copy_latency_seconds_count{" +
                              r0 + "} 0\n"));
}

}  // namespace
}  // namespace ferry
