#include "client/ferryctl/format.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "ferry/v1/dtype.h"
#include "proto/ferry/v1/words.h"

namespace ferry::ctl {

std::string Table::Render() const {
  std::vector<size_t> width(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) width[c] = columns_[c].header.size();
  for (const auto& row : rows_) {
    for (size_t c = 0; c < columns_.size() && c < row.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (size_t c = 0; c < columns_.size(); ++c) {
      const std::string& cell = c < cells.size() ? cells[c] : std::string();
      std::string pad(width[c] - std::min(width[c], cell.size()), ' ');
      if (c > 0) text += "  ";
      text += columns_[c].numeric ? pad + cell : cell + pad;
    }
    text.erase(text.find_last_not_of(' ') + 1);
    out += text + "\n";
  };
  std::vector<std::string> headers;
  for (const Column& c : columns_) headers.push_back(c.header);
  line(headers);
  for (const auto& row : rows_) line(row);
  return out;
}

std::string FormatBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string FormatUptime(double seconds) {
  auto s = static_cast<int64_t>(seconds);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm %02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh %02dm", s / 3600, (s % 3600) / 60);
  return absl::StrFormat("%dd %02dh", s / 86400, (s % 86400) / 3600);
}

std::string FormatRate(double per_second) {
  if (per_second < 100) return absl::StrFormat("%.1f", per_second);
  return absl::StrFormat("%.0f", per_second);
}

std::string FormatCount(int64_t count) {
  // Unsigned magnitude, so that INT64_MIN negates without overflow.
  const uint64_t magnitude =
      count < 0 ? uint64_t{0} - static_cast<uint64_t>(count) : static_cast<uint64_t>(count);
  const std::string digits = absl::StrCat(magnitude);
  std::string out = count < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string FormatCpuList(absl::Span<const int32_t> cpus_in) {
  std::vector<int32_t> cpus(cpus_in.begin(), cpus_in.end());
  std::sort(cpus.begin(), cpus.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(cpus[i]) : absl::StrCat(cpus[i], "-", cpus[j]));
    i = j + 1;
  }
  return parts.empty() ? "-" : absl::StrJoin(parts, ",");
}

std::string FormatDataset(const v1::JobSpec& spec) {
  const v1::DatasetSpec& d = spec.dataset();
  switch (d.kind_case()) {
    case v1::DatasetSpec::kImageFolder:
      return absl::StrCat("imagefolder ", d.image_folder().root(),
                          d.image_folder().exif_orientation() ? " (exif_orientation)" : "");
    case v1::DatasetSpec::kTokens:
      return absl::StrCat("tokens ", d.tokens().path());
    case v1::DatasetSpec::kWebdataset: {
      // A shard index lists shards by the thousand: the first and the last, and how many.
      const auto& shards = d.webdataset().shards();
      const std::string listed = shards.size() <= 3
                                     ? absl::StrJoin(shards, " ")
                                     : absl::StrCat(shards[0], " ... ", shards[shards.size() - 1],
                                                    " (", shards.size(), " shards)");
      std::vector<std::string> notes;
      if (!d.webdataset().shard_samples().empty()) notes.push_back("counted");
      if (d.webdataset().exif_orientation()) notes.push_back("exif_orientation");
      return absl::StrCat("webdataset ", listed,
                          notes.empty() ? "" : absl::StrCat(" (", absl::StrJoin(notes, ", "), ")"));
    }
    case v1::DatasetSpec::kRecords:
      return absl::StrCat("records ", d.records().path(), " (",
                          DTypeName(d.records().dtype()).data(), "[",
                          absl::StrJoin(d.records().shape(), ","), "])");
    case v1::DatasetSpec::kNpy:
      return absl::StrCat("npy ", d.npy().path());
    case v1::DatasetSpec::kTokenShards:
      return absl::StrCat("token_shards ", absl::StrJoin(d.token_shards().shards(), " "));
    case v1::DatasetSpec::kIndexed:
      return absl::StrCat("indexed ", d.indexed().path_prefix());
    case v1::DatasetSpec::kMegatronGpt: {
      const v1::MegatronGptDataset& m = d.megatron_gpt();
      return absl::StrCat("megatron_gpt ", absl::StrJoin(m.path_prefixes(), " "), " (",
                          absl::AsciiStrToLower(v1::MegatronGptDataset::Split_Name(m.split_name())),
                          " split, seq ", m.sequence_length(), ", seed ", m.random_seed(), ")");
    }
    case v1::DatasetSpec::kBlend:
      return absl::StrCat("blend of ", d.blend().sources_size(), " sources");
    case v1::DatasetSpec::KIND_NOT_SET:
      break;
  }
  return "-";
}

namespace {

// A composed transform's op by its proto name, with its size where it has one; "?" for an
// op this ferryctl does not know (a newer ferryd's).
std::string DescribeOp(const v1::TransformOp& op) {
  const google::protobuf::FieldDescriptor* field =
      v1::TransformOp::descriptor()->FindFieldByNumber(op.op_case());
  if (field == nullptr) return "?";
  switch (op.op_case()) {
    case v1::TransformOp::kRandomResizedCrop:
      return absl::StrCat(field->name(), " ", op.random_resized_crop().size());
    case v1::TransformOp::kResize:
      return absl::StrCat(field->name(), " ", op.resize().size());
    case v1::TransformOp::kCenterCrop:
      return absl::StrCat(field->name(), " ", op.center_crop().size());
    case v1::TransformOp::kRandomCrop:
      return absl::StrCat(field->name(), " ", op.random_crop().size());
    default:
      return field->name();
  }
}

}  // namespace

std::string FormatTransform(const v1::JobSpec& spec) {
  const v1::TransformSpec& t = spec.transform();
  switch (t.kind_case()) {
    case v1::TransformSpec::kRandomResizedCrop:
      return absl::StrCat("random_resized_crop ", t.random_resized_crop().size(),
                          t.random_resized_crop().flip() ? " flip" : "");
    case v1::TransformSpec::kCenterCrop:
      return absl::StrCat("center_crop ", t.center_crop().size(),
                          t.center_crop().resize() != 0
                              ? absl::StrCat(" (resize ", t.center_crop().resize(), ")")
                              : "");
    case v1::TransformSpec::kCompose:
      return absl::StrCat(
          "compose ",
          absl::StrJoin(t.compose().ops(), ", ", [](std::string* out, const v1::TransformOp& op) {
            absl::StrAppend(out, DescribeOp(op));
          }));
    case v1::TransformSpec::KIND_NOT_SET:
      break;
  }
  return "-";
}

std::string FormatField(const v1::Field& field) {
  return absl::StrCat(DTypeName(field.dtype()).data(), "[", absl::StrJoin(field.shape(), ","), "]");
}

std::string FormatLimitingStage(v1::LimitingStage stage) {
  const std::string word = v1::LimitingStageWord(stage);
  return word.empty() ? "-" : word;
}

std::string FormatTime(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

namespace {

int AttachedRanks(const v1::JobStatus& job) {
  int n = 0;
  for (const v1::RankStatus& r : job.ranks()) n += r.attached() ? 1 : 0;
  return n;
}

// A rank's stall ratio over its window: "63%"; "-" before any window was observed.
std::string FormatStall(const v1::RankStatus& r) {
  if (r.stall_window_seconds() <= 0) return "-";
  return absl::StrFormat("%.0f%%", 100 * r.stall_ratio());
}

// Of the stall window, the share the consumer's main thread waited for a CPU: "31%"; "-"
// when ferryd cannot read it.
std::string FormatCpuWait(const v1::RankStatus& r) {
  if (r.stall_window_seconds() <= 0 || r.consumer_cpu_wait_ratio() < 0) return "-";
  return absl::StrFormat("%.0f%%", 100 * r.consumer_cpu_wait_ratio());
}

// How a GPU rank's batches reach the device: "slot copy", "page-cache gather"; empty for
// the host transport.
std::string FormatCopyPath(v1::CopyPath path) {
  switch (path) {
    case v1::SLOT_COPY:
      return "slot copy";
    case v1::PAGE_CACHE_GATHER:
      return "page-cache gather";
    default:
      return "";
  }
}

}  // namespace

std::string FormatJobState(const v1::JobStatus& job) {
  if (!job.failure().empty()) return "failed";
  if (AttachedRanks(job) > 0) return job.paused().empty() ? "active" : "paused";
  std::string state = absl::StrCat("idle ", FormatUptime(job.idle_seconds()));
  if (job.deleted_in_seconds() > 0) {
    absl::StrAppend(&state, ", deleted in ", FormatUptime(job.deleted_in_seconds()));
  }
  return state;
}

std::string RenderJobs(const v1::GetStatusResponse& status) {
  if (status.jobs().empty()) return "no jobs\n";
  Table table({{"ID"},
               {"NAME"},
               {"OWNER", true},
               {"DATASET"},
               {"BATCH", true},
               {"RANKS", true},
               {"STATE"},
               {"BATCHES/S", true},
               {"SAMPLES/S", true},
               {"STALL", true},
               {"LIMIT"},
               {"ERRORS", true}});
  for (const v1::JobStatus& j : status.jobs()) {
    double batches = 0, samples = 0;
    // The most stalled attached rank speaks for the job: DDP runs at its slowest rank.
    const v1::RankStatus* stalled = nullptr;
    for (const v1::RankStatus& r : j.ranks()) {
      batches += r.batches_per_second();
      samples += r.samples_per_second();
      if (r.attached() && (stalled == nullptr || r.stall_ratio() > stalled->stall_ratio())) {
        stalled = &r;
      }
    }
    const bool active = AttachedRanks(j) > 0;
    table.AddRow({j.job().id(), j.job().name(), absl::StrCat(j.job().owner_uid()),
                  FormatDataset(j.job().spec()), absl::StrCat(j.job().spec().batch_size()),
                  absl::StrCat(AttachedRanks(j), "/", j.job().spec().world_size()),
                  FormatJobState(j), active ? FormatRate(batches) : "-",
                  active ? FormatRate(samples) : "-",
                  stalled != nullptr ? FormatStall(*stalled) : "-",
                  stalled != nullptr ? FormatLimitingStage(stalled->limiting_stage()) : "-",
                  absl::StrCat(j.errors())});
  }
  return table.Render();
}

std::string RenderStatus(const v1::GetStatusResponse& status) {
  const v1::DaemonStatus& d = status.daemon();
  std::string out;
  const uint64_t budget = d.host_memory_budget_bytes();
  std::string memory = absl::StrCat(FormatBytes(d.host_memory_in_use_bytes()), " in use of ",
                                    FormatBytes(budget), " budget");
  if (budget > 0) {
    absl::StrAppend(&memory, absl::StrFormat(" (%.1f%%)", 100.0 * d.host_memory_in_use_bytes() /
                                                              static_cast<double>(budget)));
  }
  Table info({{"ferryd"}, {d.version()}});
  info.AddRow({"pid", absl::StrCat(d.pid())});
  info.AddRow({"uptime", FormatUptime(d.uptime_seconds())});
  info.AddRow({"host memory", memory});
  info.AddRow({"cuda", d.cuda_available() ? "yes" : "no"});
  info.AddRow({"config", d.config_path().empty() ? "(built-in defaults)" : d.config_path()});
  info.AddRow({"dataset roots", d.dataset_roots().empty()
                                    ? "(none configured)"
                                    : absl::StrJoin(d.dataset_roots(), ", ")});
  info.AddRow({"idle jobs",
               d.job_idle_timeout_seconds() == 0
                   ? std::string("kept until deleted")
                   : absl::StrCat("deleted after ", FormatUptime(d.job_idle_timeout_seconds()))});
  info.AddRow(
      {"consumers", absl::StrCat(d.consumers(), " attached",
                                 d.draining() ? "; draining: exits when none is left" : "")});
  info.AddRow(
      {"workers", absl::StrFormat("%u threads, %.0f%% busy over the last 10 s; ferryd used "
                                  "%.1f CPU seconds",
                                  d.workers(), 100 * d.workers_busy_fraction(), d.cpu_seconds())});
  if (d.has_remote()) {
    const v1::RemoteStatus& r = d.remote();
    info.AddRow(
        {"remote cache",
         absl::StrCat(FormatBytes(r.cache_bytes()), " of ", FormatBytes(r.cache_capacity_bytes()),
                      " in ", r.cache_entries(), " objects (", r.cache_pinned_entries(),
                      " being read); ", r.cache_hits(), " hits, ", r.cache_misses(), " downloads, ",
                      r.cache_evictions(), " evicted")});
    std::vector<std::string> retries;
    for (const v1::ReasonCount& c : r.retries()) {
      if (c.count() > 0) retries.push_back(absl::StrCat(c.count(), " ", c.reason()));
    }
    info.AddRow({"remote reads",
                 absl::StrCat(FormatBytes(r.downloaded_bytes()), " downloaded in ", r.requests(),
                              " requests (", r.requests_in_flight(), " now); retried: ",
                              retries.empty() ? "none" : absl::StrJoin(retries, ", "), "; ",
                              r.failures(), " failed")});
  }
  out += info.Render();
  out += "\n";
  Table numa({{"NUMA NODE", true}, {"CPUS"}, {"WORKERS", true}});
  for (const v1::NumaNodeStatus& n : d.numa_nodes()) {
    numa.AddRow({absl::StrCat(n.id()), FormatCpuList(n.cpus()), absl::StrCat(n.workers())});
  }
  out += numa.Render();
  out += "\n";
  if (!d.gpus().empty()) {
    Table gpus({{"GPU", true},
                {"NAME"},
                {"PCI"},
                {"NODE", true},
                {"WORKER CPUS"},
                {"PINNED", true},
                {"DEVICE MEM", true},
                {"H2D/S", true},
                {"IN FLIGHT", true},
                {"RANKS", true}});
    for (const v1::GpuStatus& g : d.gpus()) {
      gpus.AddRow({absl::StrCat(g.ordinal()), g.name(), g.pci_bus_id(),
                   g.numa_node() < 0 ? std::string("-") : absl::StrCat(g.numa_node()),
                   FormatCpuList(g.local_cpus()), FormatBytes(g.pinned_memory_in_use_bytes()),
                   absl::StrCat(FormatBytes(g.device_memory_in_use_bytes()), " / ",
                                FormatBytes(g.device_memory_budget_bytes())),
                   FormatBytes(static_cast<uint64_t>(g.h2d_bytes_per_second())),
                   absl::StrCat(g.batches_in_flight()), absl::StrCat(g.ranks())});
    }
    out += gpus.Render();
    for (const v1::GpuStatus& g : d.gpus()) {
      if (g.jpeg_gpu_images() == 0 && g.jpeg_cpu_images() == 0) continue;
      const int64_t all = g.jpeg_gpu_images() + g.jpeg_cpu_images();
      absl::StrAppend(
          &out, "GPU ", g.ordinal(), " JPEG decode: ",
          FormatJpegCounts(g.jpeg_gpu_images(), g.jpeg_cpu_images(), g.jpeg_fallbacks()),
          absl::StrFormat("; %.0f%% on the GPU\n", 100.0 * g.jpeg_gpu_images() / all));
    }
    out += "\n";
  }
  out += RenderJobs(status);
  return out;
}

namespace {

// Milliseconds per image: three significant digits ("1.95", "0.041"), whole above 100.
std::string FormatMs(double ms) {
  return ms >= 100 ? absl::StrFormat("%.0f", ms) : absl::StrFormat("%.3g", ms);
}

// ferryd's reasons read "GPU JPEG decode is off[ for this job]: <why>"; the row says "off".
std::string OffReason(const std::string& note) {
  constexpr absl::string_view kOff = "GPU JPEG decode is off";
  const size_t colon = note.find(": ");
  if (absl::StartsWith(note, kOff) && colon != std::string::npos) return note.substr(colon + 2);
  return note;
}

}  // namespace

std::string FormatJpegCounts(int64_t gpu_images, int64_t cpu_images,
                             const google::protobuf::RepeatedPtrField<v1::ReasonCount>& fallbacks) {
  std::string counts = absl::StrCat(FormatCount(gpu_images), " images decoded on the GPU, ",
                                    FormatCount(cpu_images), " on the CPU");
  if (!fallbacks.empty()) {
    std::vector<std::string> reasons;
    for (const v1::ReasonCount& f : fallbacks) {
      reasons.push_back(absl::StrCat(f.reason(), " ", FormatCount(f.count())));
    }
    absl::StrAppend(&counts, " (not for the GPU: ", absl::StrJoin(reasons, ", "), ")");
  }
  return counts;
}

std::vector<std::string> FormatGpuDecode(const v1::JobStatus& job) {
  if (!job.has_gpu_decode()) return {};
  const v1::GpuDecodeStatus& g = job.gpu_decode();
  if (g.mode().empty()) {
    return {absl::StrCat("off: ", g.off().empty() ? "-" : OffReason(g.off()))};
  }
  std::string split = absl::StrCat(g.mode(), ": ");
  if (g.gpu_share() >= 1) {
    absl::StrAppend(&split, "every file the GPU can decode goes to it");
  } else if (g.gpu_share() <= 0) {
    absl::StrAppend(&split, g.mode() == "auto" && g.demand() <= 0
                                ? "no file goes to the GPU: the trainers do not wait for batches"
                                : "no file goes to the GPU");
  } else {
    absl::StrAppend(&split,
                    absl::StrFormat("%.0f%% of the files the GPU can decode go to it (share %.2f)",
                                    100 * g.gpu_share(), g.gpu_share()));
  }
  auto cost = [](double ms, absl::string_view where) {
    return ms > 0 ? absl::StrCat(FormatMs(ms), " ms/image ", where)
                  : absl::StrCat("not yet measured ", where);
  };
  if (g.cpu_ms_per_image() > 0 || g.gpu_ms_per_image() > 0) {
    absl::StrAppend(
        &split, "; ", cost(g.cpu_ms_per_image(), "on a worker"), ", ",
        cost(g.gpu_ms_per_image(),
             g.decoders() > 1 ? absl::StrCat("on each of ", g.decoders(), " GPUs") : "on the GPU"));
  }
  if (g.search_offset() != 0) {
    absl::StrAppend(&split, absl::StrFormat("; the search by batch rate moved the share %+.2f",
                                            g.search_offset()));
  }
  return {split, FormatJpegCounts(g.gpu_images(), g.cpu_images(), g.fallbacks())};
}

std::string FormatReadAhead(const v1::JobStatus& job) {
  if (!job.has_read_ahead()) return "";
  const v1::ReadAheadStatus& r = job.read_ahead();
  std::string line = absl::StrCat(FormatCount(r.opened()), " files fetched ahead of the workers, ",
                                  FormatCount(r.skipped()), " reached first by the workers");
  if (r.failed() > 0) absl::StrAppend(&line, ", ", FormatCount(r.failed()), " failed");
  absl::StrAppend(&line, "; window ", FormatCount(r.files_in_window()), " files, ",
                  FormatBytes(r.bytes_in_window()));
  return line;
}

std::string RenderJob(const v1::JobStatus& status) {
  const v1::Job& j = status.job();
  const v1::JobSpec& s = j.spec();
  std::vector<std::string> fields;
  for (const v1::Field& f : j.fields()) {
    fields.push_back(absl::StrCat(f.name(), " ", FormatField(f)));
  }
  std::vector<std::string> sampling = {absl::StrCat("batch ", s.batch_size())};
  sampling.push_back(s.shuffle() ? absl::StrCat("shuffle (seed ", s.seed(), ")") : "no shuffle");
  if (s.drop_last()) sampling.push_back("drop_last");
  sampling.push_back(absl::StrCat("world ", s.world_size()));

  Table info({{"job"}, {j.id()}});
  info.AddRow({"name", j.name()});
  info.AddRow({"owner uid", absl::StrCat(j.owner_uid())});
  info.AddRow({"state", FormatJobState(status)});
  info.AddRow({"dataset", absl::StrCat(FormatDataset(s), " (", j.num_samples(), " samples)")});
  for (const v1::BlendSourceStatus& b : status.blend_sources()) {
    info.AddRow({absl::StrCat("  ", b.name()),
                 absl::StrFormat("weight %.4g: %d of %d samples per epoch (%d held), %d read",
                                 b.weight(), b.samples_per_epoch(), j.samples_per_epoch(),
                                 b.num_samples(), b.samples_drawn())});
  }
  info.AddRow({"transform", FormatTransform(s)});
  info.AddRow({"sampling", absl::StrJoin(sampling, ", ")});
  info.AddRow({"device", absl::StrCat(s.device(), ", prefetch ",
                                      s.prefetch_depth() == 0 ? std::string("default")
                                                              : absl::StrCat(s.prefetch_depth()))});
  info.AddRow({"batches/epoch", absl::StrCat(j.batches_per_epoch(), " per rank")});
  info.AddRow({"fields", absl::StrJoin(fields, "; ")});
  info.AddRow({"slot", FormatBytes(j.slot_bytes())});
  if (j.create_time_unix_ms() > 0) info.AddRow({"created", FormatTime(j.create_time_unix_ms())});
  info.AddRow(
      {"bad samples", absl::StrCat(status.errors(), " (", status.quarantined(), " quarantined, ",
                                   status.substituted(), " substitutes served; policy ",
                                   s.on_corrupt_sample() == v1::FAIL ? "fail" : "skip", ")")});
  // GPU jobs: how each rank's batches reach the device (ranks of a job usually agree).
  std::vector<std::string> paths;
  for (const v1::RankStatus& r : status.ranks()) {
    std::string path = FormatCopyPath(r.copy_path());
    if (path.empty()) continue;
    if (r.pinned_dataset_bytes() != 0) {
      absl::StrAppend(&path, " (", FormatBytes(r.pinned_dataset_bytes()),
                      " of the dataset pinned)");
    }
    if (!r.copy_path_note().empty()) absl::StrAppend(&path, ": ", r.copy_path_note());
    if (std::find(paths.begin(), paths.end(), path) == paths.end()) paths.push_back(path);
  }
  if (!paths.empty()) info.AddRow({"copy path", absl::StrJoin(paths, "; ")});
  // Over the ranks that gather; the others copy every batch.
  uint64_t copied = 0, gathered = 0;
  bool can_gather = false;
  for (const v1::RankStatus& r : status.ranks()) {
    if (r.copy_path() != v1::PAGE_CACHE_GATHER) continue;
    copied += r.batches_copied();
    gathered += r.batches_gathered();
    can_gather = true;
  }
  if (can_gather) {
    info.AddRow({"gathered", absl::StrCat(gathered, " of ", copied,
                                          " batches (the others copied by workers)")});
  }
  // Image jobs: who decodes the JPEGs (the second line, if any, under the first).
  const std::vector<std::string> gpu_decode = FormatGpuDecode(status);
  for (size_t i = 0; i < gpu_decode.size(); ++i) {
    info.AddRow({i == 0 ? "gpu decode" : "", gpu_decode[i]});
  }
  if (const std::string ahead = FormatReadAhead(status); !ahead.empty()) {
    info.AddRow({"read ahead", ahead});
  }
  if (!status.paused().empty()) {
    info.AddRow({"PAUSED", absl::StrCat(status.paused(), " (a condition of this machine; ",
                                        status.transient_errors(), " reads retried)")});
  }
  if (!status.failure().empty()) info.AddRow({"FAILED", status.failure()});
  std::string out = info.Render();
  out += "\n";

  // A job whose GPUs decode JPEGs: each rank's demand for its GPU's decoder and the batches
  // that decoder took (GPU DEC: "0.90, 42").
  const bool gpu_decodes = status.has_gpu_decode() && !status.gpu_decode().mode().empty();
  std::vector<Table::Column> columns = {
      {"RANK", true},      {"DEVICE"},        {"ATTACHED"},       {"EPOCH", true},
      {"NEXT", true},      {"BATCHES", true}, {"SAMPLES", true},  {"BATCHES/S", true},
      {"SAMPLES/S", true}, {"QUEUE", true},   {"LEASED", true},   {"SLOTS", true},
      {"WAIT S", true},    {"STALL", true},   {"CPU WAIT", true}, {"LIMIT"}};
  if (gpu_decodes) columns.push_back({"GPU DEC", true});
  Table ranks(std::move(columns));
  std::vector<std::string> notes;
  std::vector<std::string> resumed;  // ranks resuming an epoch begun on another world size
  for (const v1::RankStatus& r : status.ranks()) {
    // How the consumer's batches travel: shared-memory channel or the gRPC stream.
    const std::string attached =
        r.attached() ? (r.batch_channel() ? "yes, shm" : "yes, grpc") : "no";
    std::vector<std::string> row = {absl::StrCat(r.rank()),
                                    r.device().empty() ? "-" : r.device(),
                                    attached,
                                    absl::StrCat(r.epoch()),
                                    absl::StrCat(r.next_batch()),
                                    absl::StrCat(r.batches_delivered()),
                                    absl::StrCat(r.samples_delivered()),
                                    FormatRate(r.batches_per_second()),
                                    FormatRate(r.samples_per_second()),
                                    absl::StrCat(r.queue_depth()),
                                    absl::StrCat(r.slots_leased()),
                                    absl::StrCat(r.slots()),
                                    absl::StrFormat("%.1f", r.consumer_wait_seconds()),
                                    r.attached() ? FormatStall(r) : "-",
                                    r.attached() ? FormatCpuWait(r) : "-",
                                    r.attached() ? FormatLimitingStage(r.limiting_stage()) : "-"};
    if (gpu_decodes) {
      row.push_back(absl::StrFormat("%.2f, %s", r.gpu_decode_demand(),
                                    FormatCount(static_cast<int64_t>(r.gpu_decode_batches()))));
    }
    ranks.AddRow(std::move(row));
    if (r.attached() && !r.limiting_stage_note().empty()) {
      notes.push_back(absl::StrCat("rank ", r.rank(), ": ", r.limiting_stage_note(), "\n"));
    }
    if (r.resumed_after_positions() > 0) {
      resumed.push_back(absl::StrCat("rank ", r.rank(), ": epoch ", r.epoch(),
                                     " goes on after the ", r.resumed_after_positions(),
                                     " positions an earlier run delivered (", r.epoch_batches(),
                                     " batches a rank)\n"));
    }
  }
  out += status.ranks().empty() ? "no ranks attached yet\n" : ranks.Render();
  if (!notes.empty()) out += absl::StrCat("\nlimiting stage:\n", absl::StrJoin(notes, ""));
  if (!resumed.empty()) out += absl::StrCat("\nresumed:\n", absl::StrJoin(resumed, ""));
  if (!status.recent_errors().empty()) {
    out += "\nrecent sample errors:\n";
    Table errors({{"INDEX", true}, {"PATH"}, {"MESSAGE"}});
    for (const v1::SampleError& e : status.recent_errors()) {
      errors.AddRow({absl::StrCat(e.index()), e.path(), e.message()});
    }
    out += errors.Render();
  }
  return out;
}

}  // namespace ferry::ctl
