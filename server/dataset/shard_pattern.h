// Shard lists written the way WebDataset users write them:
//   "/data/train-{000000..000146}.tar"   a numeric range, zero-padded to the width of the
//                                         first bound when it has leading zeros
//   "/data/{train,extra}-0.tar"          a list
// Patterns may hold several groups (expanded left to right, as the shell does); groups do
// not nest. A string without braces is itself.
#ifndef FERRY_SERVER_DATASET_SHARD_PATTERN_H_
#define FERRY_SERVER_DATASET_SHARD_PATTERN_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ferry {

// INVALID_ARGUMENT naming the pattern for an unbalanced or empty group, a reversed range,
// or an expansion of more than 10 million names.
absl::StatusOr<std::vector<std::string>> ExpandShardPattern(const std::string& pattern);

// All patterns expanded, in order.
absl::StatusOr<std::vector<std::string>> ExpandShardPatterns(
    const std::vector<std::string>& patterns);

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_SHARD_PATTERN_H_
