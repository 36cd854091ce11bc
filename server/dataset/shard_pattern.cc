#include "server/dataset/shard_pattern.h"

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ferry {
namespace {

constexpr size_t kMaxNames = 10'000'000;

absl::Status Bad(const std::string& pattern, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("shard pattern '", pattern, "': ", why));
}

// Alternatives of one brace group's body: "000..146" or "a,b,c".
absl::StatusOr<std::vector<std::string>> Alternatives(const std::string& pattern,
                                                      const std::string& body) {
  std::vector<std::string> out;
  const size_t dots = body.find("..");
  if (dots != std::string::npos && body.find(',') == std::string::npos) {
    const std::string lo_text = body.substr(0, dots), hi_text = body.substr(dots + 2);
    uint64_t lo, hi;
    if (lo_text.empty() || hi_text.empty() || !absl::SimpleAtoi(lo_text, &lo) ||
        !absl::SimpleAtoi(hi_text, &hi) || lo_text[0] == '-' || hi_text[0] == '-') {
      return Bad(pattern, absl::StrCat("'{", body, "}' is not a range of non-negative integers"));
    }
    if (lo > hi) return Bad(pattern, absl::StrCat("range '{", body, "}' is reversed"));
    if (hi - lo >= kMaxNames) return Bad(pattern, "expands to more than 10 million names");
    const size_t width = lo_text.size() > 1 && lo_text[0] == '0' ? lo_text.size() : 0;
    for (uint64_t i = lo; i <= hi; ++i) {
      std::string n = absl::StrCat(i);
      if (n.size() < width) n.insert(0, width - n.size(), '0');
      out.push_back(std::move(n));
    }
    return out;
  }
  for (absl::string_view part : absl::StrSplit(body, ',')) out.emplace_back(part);
  if (out.size() < 2 && body.empty()) return Bad(pattern, "empty '{}'");
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandShardPattern(const std::string& pattern) {
  std::vector<std::string> names = {""};
  size_t pos = 0;
  while (pos < pattern.size()) {
    const size_t open = pattern.find('{', pos);
    const size_t close_before = pattern.find('}', pos);
    if (close_before != std::string::npos && (open == std::string::npos || close_before < open)) {
      return Bad(pattern, "'}' without '{'");
    }
    const std::string literal = pattern.substr(pos, open == std::string::npos ? std::string::npos
                                                                               : open - pos);
    for (std::string& n : names) n += literal;
    if (open == std::string::npos) break;
    const size_t close = pattern.find('}', open);
    if (close == std::string::npos) return Bad(pattern, "'{' without '}'");
    const std::string body = pattern.substr(open + 1, close - open - 1);
    if (body.find('{') != std::string::npos) return Bad(pattern, "nested '{' is not supported");
    auto alternatives = Alternatives(pattern, body);
    if (!alternatives.ok()) return alternatives.status();
    if (names.size() * alternatives->size() > kMaxNames) {
      return Bad(pattern, "expands to more than 10 million names");
    }
    std::vector<std::string> next;
    next.reserve(names.size() * alternatives->size());
    for (const std::string& n : names) {
      for (const std::string& a : *alternatives) next.push_back(n + a);
    }
    names = std::move(next);
    pos = close + 1;
  }
  return names;
}

absl::StatusOr<std::vector<std::string>> ExpandShardPatterns(
    const std::vector<std::string>& patterns) {
  std::vector<std::string> all;
  for (const std::string& p : patterns) {
    auto names = ExpandShardPattern(p);
    if (!names.ok()) return names.status();
    all.insert(all.end(), names->begin(), names->end());
  }
  return all;
}

}  // namespace ferry
