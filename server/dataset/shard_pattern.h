// Shard lists written the way WebDataset users write them:
//   "/data/train-{000000..000146}.tar"   a numeric range, zero-padded to the width of the
//                                         first bound when it has leading zeros
//   "/data/{train,extra}-0.tar"          a list
// Patterns may hold several groups (expanded left to right, as the shell does); groups do
// not nest. A string without braces is itself.
#ifndef FERRY_SERVER_DATASET_SHARD_PATTERN_H_
#define FERRY_SERVER_DATASET_SHARD_PATTERN_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ferry {

// A job's shard list expands to at most this many names, of at most this many bytes in all:
// the cost of a request stays bounded (memory, and the time to index the shards).
inline constexpr size_t kMaxShardNames = 1'000'000;
inline constexpr size_t kMaxShardNameBytes = size_t{64} << 20;

// INVALID_ARGUMENT naming the pattern (its first 200 bytes) for an unbalanced or empty group,
// a reversed range, or an expansion past `max_names` names or `max_bytes` bytes (checked
// before the names are made).
absl::StatusOr<std::vector<std::string>> ExpandShardPattern(const std::string& pattern,
                                                            size_t max_names = kMaxShardNames,
                                                            size_t max_bytes = kMaxShardNameBytes);

// All patterns expanded, in order, within `max_names` and kMaxShardNameBytes together
// (checked before the names are made).
absl::StatusOr<std::vector<std::string>> ExpandShardPatterns(
    const std::vector<std::string>& patterns, size_t max_names = kMaxShardNames);

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_SHARD_PATTERN_H_
