#include "client/ferryctl/top.h"

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/ferryctl/format.h"

namespace ferry::ctl {

namespace {

// Debian's abseil has its own string_view.
absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Characters as the terminal counts them, near enough: UTF-8 code points (continuation
// bytes are 10xxxxxx). Wide characters count one.
size_t Columns(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

// Byte offset of code point `n` of `s` (s.size() when it has fewer).
size_t OffsetOfColumn(std::string_view s, size_t n) {
  size_t seen = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;
    if (seen++ == n) return i;
  }
  return s.size();
}

}  // namespace

std::string TruncateLine(std::string_view line, int width) {
  if (width <= 0 || Columns(line) <= static_cast<size_t>(width)) return std::string(line);
  return absl::StrCat(Absl(line.substr(0, OffsetOfColumn(line, width - 1))), "~");
}

std::string FitToScreen(std::string_view text, ScreenSize size) {
  std::vector<absl::string_view> lines = absl::StrSplit(Absl(text), '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  size_t keep = lines.size();
  std::string more;
  if (size.height > 0 && lines.size() > static_cast<size_t>(size.height)) {
    keep = size.height - 1;
    more = absl::StrCat("... ", lines.size() - keep, " more lines");
  }
  std::string out;
  for (size_t i = 0; i < keep; ++i) {
    absl::StrAppend(&out, TruncateLine({lines[i].data(), lines[i].size()}, size.width), "\n");
  }
  if (!more.empty()) absl::StrAppend(&out, TruncateLine(more, size.width), "\n");
  return out;
}

namespace {

std::string Percent(double fraction) { return absl::StrFormat("%.0f%%", 100 * fraction); }

std::string InUseOf(uint64_t in_use, uint64_t budget) {
  std::string out = FormatBytes(in_use);
  if (budget > 0) {
    absl::StrAppend(&out, " / ", FormatBytes(budget), " (",
                    Percent(static_cast<double>(in_use) / static_cast<double>(budget)), ")");
  }
  return out;
}

// ferryd's CPU use between two answers, in percent of one CPU (over 100 with several
// busy threads); "-" without a usable previous answer (none, or another ferryd since).
std::string CpuPercent(const v1::DaemonStatus& now, const v1::DaemonStatus* previous) {
  if (previous == nullptr || previous->pid() != now.pid()) return "-";
  const double wall = now.uptime_seconds() - previous->uptime_seconds();
  const double cpu = now.cpu_seconds() - previous->cpu_seconds();
  if (wall <= 0 || cpu < 0) return "-";
  return Percent(cpu / wall);
}

// Host ring (slots x slot size); on the GPU transport, the pinned slab and the device ring.
std::string RankMemory(const v1::JobStatus& job, const v1::RankStatus& r) {
  if (r.device_bytes() > 0 || r.pinned_bytes() > 0) {
    return absl::StrCat(FormatBytes(r.pinned_bytes()), " + ", FormatBytes(r.device_bytes()),
                        " dev");
  }
  return FormatBytes(uint64_t{r.slots()} * job.job().slot_bytes());
}

// The share of the job's GPU-decodable JPEGs its GPU decodes now; "off" when it decodes none
// (the reason is in `ferryctl job`), "-" for a job without images.
std::string GpuDecodeShare(const v1::JobStatus& job) {
  if (!job.has_gpu_decode()) return "-";
  if (job.gpu_decode().mode().empty()) return "off";
  return Percent(job.gpu_decode().gpu_share());
}

struct Row {
  const v1::JobStatus* job;
  const v1::RankStatus* rank;  // null for a job no rank has attached to yet
  // Sort key: stall ratio of an attached rank, -1 otherwise (after every attached rank).
  double stall;
};

constexpr size_t kMinNameWidth = 6;

}  // namespace

std::string RenderTop(const v1::GetStatusResponse& now, const v1::GetStatusResponse* previous,
                      ScreenSize size) {
  const v1::DaemonStatus& d = now.daemon();
  std::vector<std::string> header;
  std::string first = absl::StrCat(
      "ferryd ", d.version(), "  pid ", d.pid(), "  up ", FormatUptime(d.uptime_seconds()),
      "  workers ", d.workers(), " (", Percent(d.workers_busy_fraction()), " busy)  cpu ",
      CpuPercent(d, previous ? &previous->daemon() : nullptr), "  consumers ", d.consumers());
  if (d.draining()) absl::StrAppend(&first, "  DRAINING");
  header.push_back(first);
  std::string memory = absl::StrCat(
      "memory: host ", InUseOf(d.host_memory_in_use_bytes(), d.host_memory_budget_bytes()));
  if (d.pinned_memory_in_use_bytes() > 0 || d.pinned_memory_budget_bytes() > 0) {
    absl::StrAppend(&memory, "  pinned ",
                    InUseOf(d.pinned_memory_in_use_bytes(), d.pinned_memory_budget_bytes()));
  }
  header.push_back(memory);
  for (const v1::GpuStatus& g : d.gpus()) {
    header.push_back(
        absl::StrFormat("gpu %d: device %s  H2D %.2f GB/s  %u in flight  %s", g.ordinal(),
                        InUseOf(g.device_memory_in_use_bytes(), g.device_memory_budget_bytes()),
                        g.h2d_bytes_per_second() / 1e9, g.batches_in_flight(), g.name()));
  }

  std::vector<Row> rows;
  for (const v1::JobStatus& job : now.jobs()) {
    if (job.ranks().empty()) rows.push_back({&job, nullptr, -1});
    for (const v1::RankStatus& r : job.ranks()) {
      rows.push_back({&job, &r, r.attached() ? r.stall_ratio() : -1});
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    const uint32_t rank_a = a.rank ? a.rank->rank() : 0, rank_b = b.rank ? b.rank->rank() : 0;
    return std::make_tuple(-a.stall, a.job->job().id(), rank_a) <
           std::make_tuple(-b.stall, b.job->job().id(), rank_b);
  });

  // GPU DEC, after STAGE (a rank limited by decode wants it), only while some job's GPU
  // decodes JPEGs: other daemons keep the narrower table.
  const bool gpu_decode =
      std::any_of(now.jobs().begin(), now.jobs().end(),
                  [](const v1::JobStatus& job) { return !job.gpu_decode().mode().empty(); });
  std::vector<Table::Column> columns = {
      {"JOB"},         {"NAME"},  {"RANK", true},  {"STATE"},        {"SAMPLES/S", true},
      {"STALL", true}, {"STAGE"}, {"QUEUE", true}, {"LEASED", true}, {"MEMORY", true}};
  constexpr size_t kGpuDecodeColumn = 7;
  if (gpu_decode) columns.insert(columns.begin() + kGpuDecodeColumn, {"GPU DEC", true});
  std::vector<std::vector<std::string>> cells;
  for (const Row& row : rows) {
    const v1::JobStatus& job = *row.job;
    const std::string state = FormatJobState(job);
    std::vector<std::string> c;
    if (row.rank == nullptr) {
      c = {job.job().id(), job.job().name(), "-", state, "-", "-", "-", "-", "-", "-"};
    } else {
      const v1::RankStatus& r = *row.rank;
      const bool live = r.attached();
      c = {job.job().id(),
           job.job().name(),
           absl::StrCat(r.rank()),
           state,
           live ? FormatRate(r.samples_per_second()) : "-",
           live ? Percent(r.stall_ratio()) : "-",
           live ? FormatLimitingStage(r.limiting_stage()) : "-",
           absl::StrCat(r.queue_depth(), "/", r.slots()),
           absl::StrCat(r.slots_leased()),
           RankMemory(job, r)};
    }
    if (gpu_decode) c.insert(c.begin() + kGpuDecodeColumn, GpuDecodeShare(job));
    cells.push_back(std::move(c));
  }
  // The table with the columns in `shown`, names cut to name_width (0: whole).
  auto table = [&](const std::vector<bool>& shown, size_t name_width) {
    std::vector<Table::Column> kept;
    for (size_t i = 0; i < columns.size(); ++i) {
      if (shown[i]) kept.push_back(columns[i]);
    }
    Table t(std::move(kept));
    for (const std::vector<std::string>& row : cells) {
      std::vector<std::string> out;
      for (size_t i = 0; i < row.size(); ++i) {
        if (!shown[i]) continue;
        out.push_back(i == 1 && name_width > 0 ? TruncateLine(row[i], name_width) : row[i]);
      }
      t.AddRow(std::move(out));
    }
    return t.Render();
  };
  auto widest_line = [](const std::string& text) {
    size_t widest = 0;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      widest = std::max(widest, Columns({line.data(), line.size()}));
    }
    return widest;
  };
  std::vector<bool> shown(columns.size(), true);
  std::string body = rows.empty() ? std::string("no jobs\n") : table(shown, 0);
  if (size.width > 0 && !rows.empty()) {
    // As top(1) does on a narrow terminal: names shrink (to kMinNameWidth), then the
    // columns that matter least go, one at a time, until the table fits; FitToScreen
    // cuts whatever is still too wide.
    const size_t width = static_cast<size_t>(size.width);
    size_t longest_name = 0;
    for (const std::vector<std::string>& row : cells) {
      longest_name = std::max(longest_name, Columns(row[1]));
    }
    std::vector<std::string> drop_order = {"MEMORY", "LEASED", "QUEUE", "GPU DEC", "STATE"};
    size_t next_drop = 0;
    for (;;) {
      const size_t widest = widest_line(body);
      if (widest <= width) break;
      const size_t over = widest - width;
      if (longest_name > kMinNameWidth) {
        // NAME is at least as wide as its header.
        const size_t name_width =
            std::max({kMinNameWidth, size_t{4}, longest_name > over ? longest_name - over : 0});
        const std::string shorter = table(shown, name_width);
        if (widest_line(shorter) <= width) {
          body = shorter;
          break;
        }
      }
      while (next_drop < drop_order.size()) {
        const auto it = std::find_if(columns.begin(), columns.end(), [&](const Table::Column& c) {
          return c.header == drop_order[next_drop];
        });
        ++next_drop;
        if (it != columns.end()) {
          shown[it - columns.begin()] = false;
          break;
        }
      }
      const std::string fewer = table(shown, 0);
      if (next_drop >= drop_order.size() && widest_line(fewer) > width) {
        // Every droppable column is gone: shrink the names as far as they go.
        body = longest_name > kMinNameWidth ? table(shown, kMinNameWidth) : fewer;
        break;
      }
      body = fewer;
    }
  }
  std::string out = absl::StrJoin(header, "\n");
  absl::StrAppend(&out, "\n\n", body);
  return FitToScreen(out, size);
}

}  // namespace ferry::ctl
