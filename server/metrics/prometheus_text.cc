#include "server/metrics/prometheus_text.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "proto/ferry/v1/words.h"

namespace ferry {
namespace {

using ferry::v1::DaemonStatus;
using ferry::v1::GetStatusResponse;
using ferry::v1::GpuStatus;
using ferry::v1::Histogram;
using ferry::v1::JobStatus;
using ferry::v1::RankStatus;

// The Go float syntax Prometheus parses: shortest round-trip digits, +Inf, -Inf, NaN.
std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buffer[32];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), v);
  if (ec != std::errc()) return "NaN";
  return std::string(buffer, end);
}

// Label values escape backslash, double quote and newline; HELP text backslash and newline.
std::string Escape(absl::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

using LabelList = std::vector<std::pair<absl::string_view, std::string>>;

// `k1="v1",k2="v2"`: the inside of a sample's braces.
std::string Labels(const LabelList& labels) {
  std::string out;
  for (const auto& [name, value] : labels) {
    if (!out.empty()) out += ',';
    absl::StrAppend(&out, name, "=\"", Escape(value, true), "\"");
  }
  return out;
}

std::string With(const std::string& labels, absl::string_view name, absl::string_view value) {
  std::string extra = Labels({{name, std::string(value)}});
  return labels.empty() ? extra : absl::StrCat(labels, ",", extra);
}

class Writer {
 public:
  void Family(absl::string_view name, absl::string_view type, absl::string_view help) {
    absl::StrAppend(&out_, "# HELP ", name, " ", Escape(help, false), "\n# TYPE ", name, " ", type,
                    "\n");
  }
  void Sample(absl::string_view name, const std::string& labels, double value) {
    absl::StrAppend(&out_, name, labels.empty() ? "" : "{", labels, labels.empty() ? "" : "}", " ",
                    FormatValue(value), "\n");
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string JobLabels(const JobStatus& job) {
  return Labels({{"job_id", job.job().id()}, {"job_name", job.job().name()}});
}

std::string RankLabels(const JobStatus& job, const RankStatus& rank) {
  return With(JobLabels(job), "rank", absl::StrCat(rank.rank()));
}

std::string GpuLabels(const GpuStatus& gpu) {
  return Labels({{"gpu", absl::StrCat(gpu.ordinal())}});
}

template <typename T>
struct Metric {
  const char* name;
  const char* type;
  const char* help;
  double (*value)(const T&);
};

// clang-format off
const Metric<RankStatus> kRankMetrics[] = {
  {"ferry_rank_attached", "gauge", "1 while a consumer is attached to the rank.",
   [](const RankStatus& r) { return r.attached() ? 1.0 : 0.0; }},
  {"ferry_rank_batches_delivered_total", "counter", "Batches delivered to the rank's consumers.",
   [](const RankStatus& r) { return static_cast<double>(r.batches_delivered()); }},
  {"ferry_rank_samples_delivered_total", "counter", "Samples delivered to the rank's consumers.",
   [](const RankStatus& r) { return static_cast<double>(r.samples_delivered()); }},
  {"ferry_rank_queue_depth", "gauge", "Batches ready and not yet taken by the consumer.",
   [](const RankStatus& r) { return static_cast<double>(r.queue_depth()); }},
  {"ferry_rank_slots", "gauge", "Slots of the rank's ring (its prefetch depth).",
   [](const RankStatus& r) { return static_cast<double>(r.slots()); }},
  {"ferry_rank_slots_leased", "gauge", "Batches held by the consumer.",
   [](const RankStatus& r) { return static_cast<double>(r.slots_leased()); }},
  {"ferry_rank_stall_ratio", "gauge",
   "Fraction of the last ferry_rank_stall_window_seconds the trainer waited for a batch "
   "(data stall), in [0, 1].",
   [](const RankStatus& r) { return r.stall_ratio(); }},
  {"ferry_rank_stall_window_seconds", "gauge",
   "Wall time ferry_rank_stall_ratio is measured over (shorter while the consumer has been "
   "attached for less).",
   [](const RankStatus& r) { return r.stall_window_seconds(); }},
  {"ferry_rank_consumer_cpu_wait_ratio", "gauge",
   "Fraction of the same window the consumer's main thread was ready to run but waited for a "
   "CPU, in [0, 1]; -1 when ferryd cannot read it.",
   [](const RankStatus& r) { return r.consumer_cpu_wait_ratio(); }},
  {"ferry_rank_gpu_decode_demand", "gauge",
   "GPU image jobs: the rank's demand for its GPU's JPEG decoder, in [0, 1] (its trainer's "
   "waits raise it).",
   [](const RankStatus& r) { return r.gpu_decode_demand(); }},
  {"ferry_rank_gpu_decode_batches_total", "counter",
   "Batches of the rank whose JPEGs its GPU's decoder took.",
   [](const RankStatus& r) { return static_cast<double>(r.gpu_decode_batches()); }},
  {"ferry_rank_consumer_wait_seconds_total", "counter",
   "Time ferryd had no batch ready for a consumer holding fewer than all slots (an upper bound "
   "on its wait).",
   [](const RankStatus& r) { return r.consumer_wait_seconds(); }},
  {"ferry_rank_batches_filled_total", "counter", "Batches the workers filled for the rank.",
   [](const RankStatus& r) { return static_cast<double>(r.batches_filled()); }},
  {"ferry_rank_fill_seconds_total", "counter",
   "Time from scheduling a batch to its last row, summed over ferry_rank_batches_filled_total.",
   [](const RankStatus& r) { return r.fill_seconds(); }},
  {"ferry_rank_epoch", "gauge", "Epoch the rank is in.",
   [](const RankStatus& r) { return static_cast<double>(r.epoch()); }},
  {"ferry_rank_h2d_bytes_total", "counter",
   "Bytes copied host-to-device for the rank (GPU transport).",
   [](const RankStatus& r) { return static_cast<double>(r.bytes_to_device()); }},
  {"ferry_rank_device_memory_bytes", "gauge", "Device bytes of the rank's ring (GPU transport).",
   [](const RankStatus& r) { return static_cast<double>(r.device_bytes()); }},
  {"ferry_rank_pinned_memory_bytes", "gauge", "Pinned bytes of the rank's slab (GPU transport).",
   [](const RankStatus& r) { return static_cast<double>(r.pinned_bytes()); }},
};

const Metric<JobStatus> kJobMetrics[] = {
  {"ferry_job_samples_decoded_total", "counter",
   "Samples the workers read and transformed (prefetched and abandoned ones included).",
   [](const JobStatus& j) { return static_cast<double>(j.samples_decoded()); }},
  {"ferry_job_read_bytes_total", "counter", "Bytes read from the job's dataset files.",
   [](const JobStatus& j) { return static_cast<double>(j.bytes_read()); }},
  {"ferry_job_quarantined_samples", "gauge", "Samples remembered as bad and never read again.",
   [](const JobStatus& j) { return static_cast<double>(j.quarantined()); }},
  {"ferry_job_substituted_samples_total", "counter",
   "Substitutes delivered in place of quarantined samples.",
   [](const JobStatus& j) { return static_cast<double>(j.substituted()); }},
  {"ferry_job_transient_read_errors_total", "counter",
   "Reads that failed for a reason of the machine (retried, never quarantined).",
   [](const JobStatus& j) { return static_cast<double>(j.transient_errors()); }},
  {"ferry_job_paused", "gauge", "1 while the job's reads wait on a condition of the machine.",
   [](const JobStatus& j) { return j.paused().empty() ? 0.0 : 1.0; }},
  {"ferry_job_failed", "gauge", "1 once the job has stopped with an error.",
   [](const JobStatus& j) { return j.failure().empty() ? 0.0 : 1.0; }},
  {"ferry_job_idle_seconds", "gauge", "Seconds since the job last had a consumer (0 while one is).",
   [](const JobStatus& j) { return j.idle_seconds(); }},
};

const Metric<GpuStatus> kGpuMetrics[] = {
  {"ferry_gpu_device_memory_in_use_bytes", "gauge", "Device bytes ferryd holds on the GPU.",
   [](const GpuStatus& g) { return static_cast<double>(g.device_memory_in_use_bytes()); }},
  {"ferry_gpu_device_memory_budget_bytes", "gauge", "Cap on ferryd's device bytes on the GPU.",
   [](const GpuStatus& g) { return static_cast<double>(g.device_memory_budget_bytes()); }},
  {"ferry_gpu_pinned_memory_in_use_bytes", "gauge",
   "Pinned host bytes of the slabs feeding the GPU.",
   [](const GpuStatus& g) { return static_cast<double>(g.pinned_memory_in_use_bytes()); }},
  {"ferry_gpu_h2d_bytes_total", "counter", "Bytes copied host-to-device since ferryd started.",
   [](const GpuStatus& g) { return static_cast<double>(g.bytes_to_device()); }},
  {"ferry_gpu_batches_in_flight", "gauge", "Batch copies enqueued on the GPU and not complete.",
   [](const GpuStatus& g) { return static_cast<double>(g.batches_in_flight()); }},
  {"ferry_gpu_ranks", "gauge", "Rank pipelines with a device ring on the GPU.",
   [](const GpuStatus& g) { return static_cast<double>(g.ranks()); }},
};
// clang-format on

// The fixed reasons of JobStatus.errors_by_reason: each is always exported (0 until seen), so
// rate() has a start; a reason outside the set is exported as it comes.
constexpr absl::string_view kBadSampleReasons[] = {"corrupt", "missing", "unreadable", "too_large",
                                                   "other"};

// The reasons of GpuDecodeStatus.fallbacks (GpuJpegRejectName's, and not_jpeg): exported as
// kBadSampleReasons are, each always (0 until seen), one outside the set as it comes.
constexpr absl::string_view kGpuDecodeFallbackReasons[] = {"corrupt",
                                                           "progressive",
                                                           "unsupported_coding",
                                                           "unsupported_subsampling",
                                                           "cmyk",
                                                           "unsupported_color_space",
                                                           "too_large",
                                                           "decoder_refused",
                                                           "not_jpeg"};

// A Prometheus histogram from Histogram's per-bucket counts: running sums as le buckets,
// the +Inf bucket and _count equal (the larger of the running total and `count`, should
// the two ever disagree).
void WriteHistogram(Writer* w, absl::string_view name, const std::string& labels,
                    const Histogram& h) {
  const std::string bucket = absl::StrCat(name, "_bucket");
  uint64_t running = 0;
  for (int i = 0; i < h.bounds_size(); ++i) {
    if (i < h.counts_size()) running += h.counts(i);
    w->Sample(bucket, With(labels, "le", FormatValue(h.bounds(i))), static_cast<double>(running));
  }
  for (int i = h.bounds_size(); i < h.counts_size(); ++i) running += h.counts(i);
  const double total = static_cast<double>(std::max<uint64_t>(running, h.count()));
  w->Sample(bucket, With(labels, "le", "+Inf"), total);
  w->Sample(absl::StrCat(name, "_sum"), labels, h.sum());
  w->Sample(absl::StrCat(name, "_count"), labels, total);
}

// Counts by reason: every reason of `fixed` (0 where absent), then those outside it.
template <typename Counts, size_t N>
void WriteReasons(Writer* w, absl::string_view name, const std::string& labels,
                  const Counts& counts, const absl::string_view (&fixed)[N]) {
  for (absl::string_view reason : fixed) {
    double count = 0;
    for (const auto& r : counts) {
      if (r.reason() == reason) count += static_cast<double>(r.count());
    }
    w->Sample(name, With(labels, "reason", reason), count);
  }
  for (const auto& r : counts) {
    bool known = false;
    for (absl::string_view reason : fixed) known = known || r.reason() == reason;
    if (!known) w->Sample(name, With(labels, "reason", r.reason()), static_cast<double>(r.count()));
  }
}

// Jobs whose GPU decodes JPEGs (GpuDecodeStatus.mode set); one where it is off has none of
// these series.
void WriteGpuDecode(Writer* w, const GetStatusResponse& status) {
  w->Family("ferry_job_gpu_decode_images_total", "counter",
            "Images of a job whose GPU decodes JPEGs, by who decoded them: decoder=\"gpu\" "
            "(nvJPEG), decoder=\"cpu\" (the workers, fallbacks included).");
  for (const JobStatus& job : status.jobs()) {
    if (job.gpu_decode().mode().empty()) continue;
    const std::string labels = JobLabels(job);
    w->Sample("ferry_job_gpu_decode_images_total", With(labels, "decoder", "gpu"),
              static_cast<double>(job.gpu_decode().gpu_images()));
    w->Sample("ferry_job_gpu_decode_images_total", With(labels, "decoder", "cpu"),
              static_cast<double>(job.gpu_decode().cpu_images()));
  }
  w->Family("ferry_job_gpu_decode_fallbacks_total", "counter",
            "Files the workers decoded because the GPU could not, by reason: corrupt, "
            "progressive, unsupported_coding, unsupported_subsampling, cmyk, "
            "unsupported_color_space, too_large, decoder_refused, not_jpeg.");
  for (const JobStatus& job : status.jobs()) {
    if (job.gpu_decode().mode().empty()) continue;
    WriteReasons(w, "ferry_job_gpu_decode_fallbacks_total", JobLabels(job),
                 job.gpu_decode().fallbacks(), kGpuDecodeFallbackReasons);
  }
  w->Family("ferry_job_gpu_decode_share", "gauge",
            "The share of a job's GPU-decodable JPEGs given to the GPUs now, the ranks' mean "
            "(1 in gpu_decode mode \"gpu\").");
  for (const JobStatus& job : status.jobs()) {
    if (job.gpu_decode().mode().empty()) continue;
    w->Sample("ferry_job_gpu_decode_share", JobLabels(job), job.gpu_decode().gpu_share());
  }
  w->Family("ferry_job_gpu_decode_search_offset", "gauge",
            "gpu_decode \"auto\": what the search by batch rate added to the share the measured "
            "costs balance, in [-1, 1].");
  for (const JobStatus& job : status.jobs()) {
    if (job.gpu_decode().mode().empty()) continue;
    w->Sample("ferry_job_gpu_decode_search_offset", JobLabels(job),
              job.gpu_decode().search_offset());
  }
}

// Jobs whose files ferryd reads ahead (JobStatus.read_ahead); the others have none of these
// series.
void WriteReadAhead(Writer* w, const GetStatusResponse& status) {
  w->Family("ferry_job_read_ahead_files_total", "counter",
            "Files of a job the read-ahead took up: outcome=\"opened\" (fetched ahead of the "
            "workers, or found in the node cache), \"failed\", \"skipped\" (the workers "
            "reached them first).");
  for (const JobStatus& job : status.jobs()) {
    if (!job.has_read_ahead()) continue;
    const std::string labels = JobLabels(job);
    const ferry::v1::ReadAheadStatus& r = job.read_ahead();
    w->Sample("ferry_job_read_ahead_files_total", With(labels, "outcome", "opened"),
              static_cast<double>(r.opened()));
    w->Sample("ferry_job_read_ahead_files_total", With(labels, "outcome", "failed"),
              static_cast<double>(r.failed()));
    w->Sample("ferry_job_read_ahead_files_total", With(labels, "outcome", "skipped"),
              static_cast<double>(r.skipped()));
  }
  using ferry::v1::ReadAheadStatus;
  const struct {
    const char* name;
    const char* help;
    double (*value)(const ReadAheadStatus&);
  } kWindow[] = {
      {"ferry_job_read_ahead_window_files",
       "Files in a job's read-ahead window, waiting for their batch.",
       [](const ReadAheadStatus& r) { return static_cast<double>(r.files_in_window()); }},
      {"ferry_job_read_ahead_window_bytes", "Bytes of the files in the window that were opened.",
       [](const ReadAheadStatus& r) { return static_cast<double>(r.bytes_in_window()); }},
  };
  for (const auto& m : kWindow) {
    w->Family(m.name, "gauge", m.help);
    for (const JobStatus& job : status.jobs()) {
      if (job.has_read_ahead()) w->Sample(m.name, JobLabels(job), m.value(job.read_ahead()));
    }
  }
}

// The node cache of remote datasets and the transfers that fill it.
void WriteRemote(Writer* w, const ferry::v1::RemoteStatus& r) {
  w->Family("ferry_remote_cache_bytes", "gauge",
            "Bytes the node cache of remote objects holds (entries being filled included).");
  w->Sample("ferry_remote_cache_bytes", "", static_cast<double>(r.cache_bytes()));
  w->Family("ferry_remote_cache_capacity_bytes", "gauge", "remote.cache_bytes.");
  w->Sample("ferry_remote_cache_capacity_bytes", "", static_cast<double>(r.cache_capacity_bytes()));
  w->Family("ferry_remote_cache_entries", "gauge",
            "Objects in the node cache; state=\"pinned\": being read, never evicted.");
  w->Sample("ferry_remote_cache_entries", Labels({{"state", "all"}}),
            static_cast<double>(r.cache_entries()));
  w->Sample("ferry_remote_cache_entries", Labels({{"state", "pinned"}}),
            static_cast<double>(r.cache_pinned_entries()));
  w->Family("ferry_remote_cache_lookups_total", "counter",
            "Opens of remote objects: result=\"hit\" served from the cache, \"miss\" "
            "downloaded.");
  w->Sample("ferry_remote_cache_lookups_total", Labels({{"result", "hit"}}),
            static_cast<double>(r.cache_hits()));
  w->Sample("ferry_remote_cache_lookups_total", Labels({{"result", "miss"}}),
            static_cast<double>(r.cache_misses()));
  w->Family("ferry_remote_cache_evictions_total", "counter",
            "Entries evicted from the node cache to make room.");
  w->Sample("ferry_remote_cache_evictions_total", "", static_cast<double>(r.cache_evictions()));
  w->Family("ferry_remote_downloaded_bytes_total", "counter",
            "Bytes received from object stores and HTTP servers.");
  w->Sample("ferry_remote_downloaded_bytes_total", "", static_cast<double>(r.downloaded_bytes()));
  w->Family("ferry_remote_requests_total", "counter", "Requests sent to stores (attempts).");
  w->Sample("ferry_remote_requests_total", "", static_cast<double>(r.requests()));
  w->Family("ferry_remote_requests_in_flight", "gauge", "Requests being answered now.");
  w->Sample("ferry_remote_requests_in_flight", "", r.requests_in_flight());
  w->Family("ferry_remote_retries_total", "counter",
            "Attempts that failed and were tried again, by cause (connection, throttled, "
            "server, short).");
  for (const ferry::v1::ReasonCount& retries : r.retries()) {
    w->Sample("ferry_remote_retries_total", Labels({{"cause", retries.reason()}}),
              static_cast<double>(retries.count()));
  }
  w->Family("ferry_remote_failures_total", "counter",
            "Requests that failed for good (missing, refused, out of retries).");
  w->Sample("ferry_remote_failures_total", "", static_cast<double>(r.failures()));
}

void WriteDaemon(Writer* w, const DaemonStatus& d, int jobs) {
  w->Family("ferry_build_info", "gauge", "ferryd's version; always 1.");
  w->Sample("ferry_build_info", Labels({{"version", d.version()}}), 1);
  w->Family("ferry_uptime_seconds", "gauge", "Seconds since ferryd started.");
  w->Sample("ferry_uptime_seconds", "", d.uptime_seconds());
  w->Family("ferry_cpu_seconds_total", "counter", "ferryd's CPU time (user + system).");
  w->Sample("ferry_cpu_seconds_total", "", d.cpu_seconds());
  w->Family("ferry_workers", "gauge", "Worker threads.");
  w->Sample("ferry_workers", "", d.workers());
  w->Family("ferry_workers_busy_ratio", "gauge",
            "Fraction of the workers' wall time over the last few seconds spent on tasks.");
  w->Sample("ferry_workers_busy_ratio", "", d.workers_busy_fraction());
  w->Family("ferry_memory_in_use_bytes", "gauge",
            "Host memory ferryd holds: pool=\"host\" shared-memory slabs, pool=\"pinned\" "
            "pinned (registered) host bytes.");
  w->Sample("ferry_memory_in_use_bytes", Labels({{"pool", "host"}}),
            static_cast<double>(d.host_memory_in_use_bytes()));
  w->Sample("ferry_memory_in_use_bytes", Labels({{"pool", "pinned"}}),
            static_cast<double>(d.pinned_memory_in_use_bytes()));
  w->Family("ferry_memory_budget_bytes", "gauge",
            "Caps on ferry_memory_in_use_bytes (host_memory_budget_bytes, "
            "pinned_memory_budget_bytes).");
  w->Sample("ferry_memory_budget_bytes", Labels({{"pool", "host"}}),
            static_cast<double>(d.host_memory_budget_bytes()));
  w->Sample("ferry_memory_budget_bytes", Labels({{"pool", "pinned"}}),
            static_cast<double>(d.pinned_memory_budget_bytes()));
  w->Family("ferry_consumers", "gauge", "Consumers attached over all jobs.");
  w->Sample("ferry_consumers", "", d.consumers());
  w->Family("ferry_jobs", "gauge", "Jobs ferryd holds.");
  w->Sample("ferry_jobs", "", jobs);
  w->Family("ferry_draining", "gauge", "1 once a drain has begun.");
  w->Sample("ferry_draining", "", d.draining() ? 1 : 0);
  w->Family("ferry_cuda_available", "gauge", "1 when ferryd can use GPUs.");
  w->Sample("ferry_cuda_available", "", d.cuda_available() ? 1 : 0);
  if (d.has_remote()) WriteRemote(w, d.remote());
}

}  // namespace

std::string StatusToPrometheus(const GetStatusResponse& status) {
  Writer w;
  WriteDaemon(&w, status.daemon(), status.jobs_size());

  w.Family("ferry_gpu_info", "gauge", "A GPU ferryd uses; always 1.");
  for (const GpuStatus& gpu : status.daemon().gpus()) {
    w.Sample("ferry_gpu_info",
             Labels({{"gpu", absl::StrCat(gpu.ordinal())},
                     {"name", gpu.name()},
                     {"pci_bus_id", gpu.pci_bus_id()},
                     {"numa_node", absl::StrCat(gpu.numa_node())}}),
             1);
  }
  for (const auto& m : kGpuMetrics) {
    w.Family(m.name, m.type, m.help);
    for (const GpuStatus& gpu : status.daemon().gpus())
      w.Sample(m.name, GpuLabels(gpu), m.value(gpu));
  }

  w.Family("ferry_job_info", "gauge", "A job ferryd holds; always 1.");
  for (const JobStatus& job : status.jobs()) {
    w.Sample("ferry_job_info",
             With(With(JobLabels(job), "device", job.job().spec().device()), "owner_uid",
                  absl::StrCat(job.job().owner_uid())),
             1);
  }
  for (const auto& m : kJobMetrics) {
    w.Family(m.name, m.type, m.help);
    for (const JobStatus& job : status.jobs()) w.Sample(m.name, JobLabels(job), m.value(job));
  }
  w.Family("ferry_job_bad_samples_total", "counter",
           "Bad samples (each counted once) by reason: corrupt, missing, unreadable, too_large, "
           "other.");
  for (const JobStatus& job : status.jobs()) {
    WriteReasons(&w, "ferry_job_bad_samples_total", JobLabels(job), job.errors_by_reason(),
                 kBadSampleReasons);
  }
  w.Family("ferry_job_blend_source_samples_drawn_total", "counter",
           "Positions of batches drawn from each source of a blend (label source: its name).");
  for (const JobStatus& job : status.jobs()) {
    const std::string labels = JobLabels(job);
    for (const auto& b : job.blend_sources()) {
      w.Sample("ferry_job_blend_source_samples_drawn_total", With(labels, "source", b.name()),
               static_cast<double>(b.samples_drawn()));
    }
  }

  WriteGpuDecode(&w, status);
  WriteReadAhead(&w, status);

  for (const auto& m : kRankMetrics) {
    w.Family(m.name, m.type, m.help);
    for (const JobStatus& job : status.jobs()) {
      for (const RankStatus& rank : job.ranks())
        w.Sample(m.name, RankLabels(job, rank), m.value(rank));
    }
  }
  w.Family("ferry_rank_limiting_stage", "gauge",
           "The stage limiting the rank over the stall window: 1 for the current stage, 0 for "
           "the others (stage: unknown, trainer, read, decode, copy).");
  for (const JobStatus& job : status.jobs()) {
    for (const RankStatus& rank : job.ranks()) {
      const std::string labels = RankLabels(job, rank);
      // A series per stage this exporter knows, "unknown" for UNSPECIFIED; a stage newer
      // than it counts as unknown: one series of them is 1.
      const int current = ferry::v1::LimitingStage_IsValid(rank.limiting_stage())
                              ? rank.limiting_stage()
                              : ferry::v1::LIMITING_STAGE_UNSPECIFIED;
      const google::protobuf::EnumDescriptor* stages = ferry::v1::LimitingStage_descriptor();
      for (int i = 0; i < stages->value_count(); ++i) {
        const int stage = stages->value(i)->number();
        const std::string word = ferry::v1::LimitingStageWord(stage);
        w.Sample("ferry_rank_limiting_stage",
                 With(labels, "stage", word.empty() ? "unknown" : word), current == stage);
      }
    }
  }
  const std::pair<const char*, const char*> histograms[] = {
      {"ferry_rank_handoff_latency_seconds",
       "A batch's handoff: from deliverable (filled, copied, next in order) to handed to the "
       "consumer."},
      {"ferry_rank_copy_latency_seconds",
       "A batch's copy to the GPU: from enqueued to its ready signal seen complete."},
  };
  for (const auto& [name, help] : histograms) {
    w.Family(name, "histogram", help);
    const bool handoff = absl::string_view(name) == histograms[0].first;
    for (const JobStatus& job : status.jobs()) {
      for (const RankStatus& rank : job.ranks()) {
        WriteHistogram(&w, name, RankLabels(job, rank),
                       handoff ? rank.handoff_latency() : rank.copy_latency());
      }
    }
  }
  return w.Take();
}

}  // namespace ferry
