// Text rendering for ferryctl: aligned tables and human-readable numbers. Pure functions
// over ferryd's answers (the ferry.v1 messages), so they are unit-tested without a daemon.
#ifndef FERRY_CLIENT_FERRYCTL_FORMAT_H_
#define FERRY_CLIENT_FERRYCTL_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "ferry/v1/ferry.pb.h"
#include "google/protobuf/repeated_ptr_field.h"

namespace ferry::ctl {

// Columns padded to their widest cell, separated by two spaces; columns marked numeric are
// right-aligned. Trailing spaces are trimmed.
class Table final {
 public:
  struct Column {
    std::string header;
    bool numeric = false;
  };
  explicit Table(std::vector<Column> columns) : columns_(std::move(columns)) {}
  // `cells` must have one entry per column.
  void AddRow(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  std::string Render() const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// 1536 -> "1.5 KiB"; below 1 KiB: "512 B".
std::string FormatBytes(uint64_t bytes);
// Seconds -> "45s", "3m 07s", "2h 03m", "4d 01h".
std::string FormatUptime(double seconds);
// One decimal below 100, none above: "12.5", "1234".
std::string FormatRate(double per_second);
// Thousands separated: 120345 -> "120,345", -1234 -> "-1,234".
std::string FormatCount(int64_t count);
// "1,200 images decoded on the GPU, 300 on the CPU (not for the GPU: progressive 12, ...)".
std::string FormatJpegCounts(int64_t gpu_images, int64_t cpu_images,
                             const google::protobuf::RepeatedPtrField<v1::ReasonCount>& fallbacks);
// [0,1,2,3,8,10,11] -> "0-3,8,10-11".
std::string FormatCpuList(absl::Span<const int32_t> cpus);
// "imagefolder /data/train" or "tokens /data/t.bin".
std::string FormatDataset(const v1::JobSpec& spec);
// "random_resized_crop 224 flip", "center_crop 224 (resize 256)",
// "compose random_crop 32, random_horizontal_flip, normalize", "-". A composed op this
// ferryctl does not know is "?".
std::string FormatTransform(const v1::JobSpec& spec);
// "uint8[224,224,3]".
std::string FormatField(const v1::Field& field);
// "trainer", "trainer_cpu", "read", "remote_read", "decode", "copy"; "-" when not known (no
// consumer, too little seen).
std::string FormatLimitingStage(v1::LimitingStage stage);
// Unix milliseconds -> "2026-11-22 05:04:20 UTC".
std::string FormatTime(int64_t unix_ms);
// "active", "paused", "failed", or "idle 3m 10s, deleted in 6m 50s".
std::string FormatJobState(const v1::JobStatus& job);
// Who decodes the job's JPEGs, in one or two lines: `off: <why>`, or the mode with the
// GPU's share and the measured costs, then the images each side decoded with the GPU's
// fallbacks by reason. Empty where the job has no gpu_decode.
std::vector<std::string> FormatGpuDecode(const v1::JobStatus& job);
// A job's read-ahead (JobStatus.read_ahead) in one line; empty when it has none.
std::string FormatReadAhead(const v1::JobStatus& job);

std::string RenderStatus(const v1::GetStatusResponse& status);
std::string RenderJobs(const v1::GetStatusResponse& status);
std::string RenderJob(const v1::JobStatus& status);

}  // namespace ferry::ctl

#endif  // FERRY_CLIENT_FERRYCTL_FORMAT_H_
