// A WebDataset shard index: the JSON that webdataset's `widsindex create` writes
// ("__kind__": "wids-shard-index-v1"), which lists every shard with its sample count:
//
//   {"wids_version": 1, "base": "s3://bucket/train",          (base optional)
//    "shardlist": [{"url": "train-000000.tar", "nsamples": 10000, "filesize": ...}, ...]}
//
// A job given one knows each shard's samples before the shard's bytes arrive, so it can
// start while later shards download (WebDatasetSource's lazy indexing). A shard's samples
// are what WebDataset groups them into: runs of members sharing a basename.
#ifndef FERRY_SERVER_DATASET_WEBDATASET_INDEX_H_
#define FERRY_SERVER_DATASET_WEBDATASET_INDEX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/dataset/dataset_fs.h"

namespace ferry {

struct ShardIndexEntry {
  std::string location;  // resolved: a local path, s3:// or http(s):// location
  uint64_t samples = 0;
};

// The largest index read (an index of a million shards is about 100 MB).
inline constexpr uint64_t kMaxShardIndexBytes = uint64_t{256} << 20;

// Parses the index read from `index_location`. A shard's "url" with a scheme ("s3://",
// "https://") is taken as it is; otherwise it is resolved against the index's "base", else
// the index's own directory: "a.tar" -> "<dir>/a.tar", "/x/a.tar" -> the path /x/a.tar on
// the index's own store (its bucket, its host) or disk; "." and ".." segments are applied.
// INVALID_ARGUMENT naming `index_location` for: JSON that does not parse, a wids_version
// other than 1, an empty or missing shardlist, a shard without "url" or with an "nsamples"
// that is not a whole number >= 0, sub-datasets ("datasets", which ferry does not follow).
absl::StatusOr<std::vector<ShardIndexEntry>> ParseShardIndex(absl::string_view json,
                                                             const std::string& index_location);

// Reads the index at `index_location` through `fs` (at most kMaxShardIndexBytes) and parses
// it. Open and read errors as DatasetFs gives them, prefixed with what was being read.
absl::StatusOr<std::vector<ShardIndexEntry>> ReadShardIndex(const std::string& index_location,
                                                            const DatasetFs& fs);

// `relative` resolved against the directory or location `base` (the rules above).
std::string ResolveShardLocation(const std::string& base, const std::string& relative);

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_WEBDATASET_INDEX_H_
