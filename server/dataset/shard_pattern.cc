#include "server/dataset/shard_pattern.h"

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ferry {
namespace {

// A pattern is quoted up to this many bytes in messages.
constexpr size_t kMaxQuoted = 200;

absl::Status Bad(const std::string& pattern, const std::string& why) {
  const std::string quoted =
      pattern.size() <= kMaxQuoted ? pattern : absl::StrCat(pattern.substr(0, kMaxQuoted), "...");
  return absl::InvalidArgumentError(absl::StrCat("shard pattern '", quoted, "': ", why));
}

// What a whole shard list may expand to, for messages.
struct ListBound {
  size_t names = kMaxShardNames;
  size_t bytes = kMaxShardNameBytes;
};

absl::Status TooMany(const std::string& pattern, const ListBound& bound) {
  return Bad(pattern,
             absl::StrCat("the shard list expands to more than ", bound.names, " names or ",
                          bound.bytes >> 20, " MiB of names; list fewer, larger shards"));
}

// Alternatives of one brace group's body: "000..146" or "a,b,c".
// At most `budget` of them: more is TooMany (checked before any is made).
absl::StatusOr<std::vector<std::string>> Alternatives(const std::string& pattern,
                                                      const std::string& body, size_t budget,
                                                      const ListBound& bound) {
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
    if (hi - lo >= budget) return TooMany(pattern, bound);
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

// How many names `pattern` expands to, counted from its groups' sizes without making any;
// `limit` + 1 once it is more than `limit`. A malformed group counts as one name (Expand
// says what is wrong with it).
size_t CountNames(const std::string& pattern, size_t limit) {
  size_t count = 1;
  for (size_t open = pattern.find('{'); open != std::string::npos;
       open = pattern.find('{', open + 1)) {
    const size_t close = pattern.find('}', open);
    if (close == std::string::npos) break;
    const std::string body = pattern.substr(open + 1, close - open - 1);
    size_t n = 1;
    const size_t dots = body.find("..");
    uint64_t lo, hi;
    if (dots == std::string::npos || body.find(',') != std::string::npos) {
      n = static_cast<size_t>(std::count(body.begin(), body.end(), ',')) + 1;
    } else if (absl::SimpleAtoi(body.substr(0, dots), &lo) &&
               absl::SimpleAtoi(body.substr(dots + 2), &hi) && lo <= hi) {
      n = hi - lo >= limit ? limit + 1 : static_cast<size_t>(hi - lo + 1);
    }
    if (count > limit / n) return limit + 1;
    count *= n;
  }
  return count;
}

// ExpandShardPattern within `max_names` and `max_bytes`, what is left of `bound`.
absl::StatusOr<std::vector<std::string>> Expand(const std::string& pattern, size_t max_names,
                                                size_t max_bytes, const ListBound& bound) {
  std::vector<std::string> names = {""};
  size_t bytes = 0;  // of all names
  size_t pos = 0;
  while (pos < pattern.size()) {
    const size_t open = pattern.find('{', pos);
    const size_t close_before = pattern.find('}', pos);
    if (close_before != std::string::npos && (open == std::string::npos || close_before < open)) {
      return Bad(pattern, "'}' without '{'");
    }
    const std::string literal =
        pattern.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    if (literal.size() > 0 && (names.size() > max_bytes / literal.size() ||
                               bytes + names.size() * literal.size() > max_bytes)) {
      return TooMany(pattern, bound);
    }
    bytes += names.size() * literal.size();
    for (std::string& n : names) n += literal;
    if (open == std::string::npos) break;
    const size_t close = pattern.find('}', open);
    if (close == std::string::npos) return Bad(pattern, "'{' without '}'");
    const std::string body = pattern.substr(open + 1, close - open - 1);
    if (body.find('{') != std::string::npos) return Bad(pattern, "nested '{' is not supported");
    auto alternatives = Alternatives(pattern, body, max_names / names.size(), bound);
    if (!alternatives.ok()) return alternatives.status();
    if (names.size() * alternatives->size() > max_names) return TooMany(pattern, bound);
    // Every name is copied once per alternative, and each alternative once per name.
    size_t alternative_bytes = 0;
    for (const std::string& a : *alternatives) alternative_bytes += a.size();
    if (bytes > max_bytes / alternatives->size() || alternative_bytes > max_bytes / names.size() ||
        bytes * alternatives->size() + alternative_bytes * names.size() > max_bytes) {
      return TooMany(pattern, bound);
    }
    bytes = bytes * alternatives->size() + alternative_bytes * names.size();
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

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandShardPattern(const std::string& pattern,
                                                            size_t max_names, size_t max_bytes) {
  const ListBound bound{max_names, max_bytes};
  if (CountNames(pattern, max_names) > max_names) return TooMany(pattern, bound);
  return Expand(pattern, max_names, max_bytes, bound);
}

absl::StatusOr<std::vector<std::string>> ExpandShardPatterns(
    const std::vector<std::string>& patterns, size_t max_names) {
  const ListBound bound{max_names, kMaxShardNameBytes};
  // The whole list's count first, so that no name is made when it is too long.
  size_t count = 0;
  for (const std::string& p : patterns) {
    count += CountNames(p, max_names);
    if (count > max_names) return TooMany(p, bound);
  }
  std::vector<std::string> all;
  size_t bytes = 0;
  for (const std::string& p : patterns) {
    if (all.size() >= max_names) return TooMany(p, bound);
    auto names = Expand(p, max_names - all.size(), kMaxShardNameBytes - bytes, bound);
    if (!names.ok()) return names.status();
    for (std::string& n : *names) {
      bytes += n.size();
      all.push_back(std::move(n));
    }
  }
  return all;
}

}  // namespace ferry
