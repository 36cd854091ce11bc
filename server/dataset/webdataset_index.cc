#include "server/dataset/webdataset_index.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace ferry {
namespace {

using google::protobuf::Value;

// "s3://...", "https://...": a scheme (letters, digits, '+', '-', '.') before "://".
bool HasScheme(absl::string_view location) {
  const size_t colon = location.find("://");
  if (colon == absl::string_view::npos || colon == 0) return false;
  for (char c : location.substr(0, colon)) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '.') {
      return false;
    }
  }
  return true;
}

absl::Status IndexError(const std::string& index, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("shard index '", index.substr(0, 512), "' ", what,
                   "; it must be a WebDataset shard index (widsindex create): {\"wids_version\": "
                   "1, \"shardlist\": [{\"url\": \"a.tar\", \"nsamples\": 1000}, ...]}"));
}

const Value* Field(const Value& object, const std::string& name) {
  if (object.kind_case() != Value::kStructValue) return nullptr;
  const auto& fields = object.struct_value().fields();
  auto it = fields.find(name);
  return it == fields.end() ? nullptr : &it->second;
}

}  // namespace

std::string ResolveShardLocation(const std::string& base, const std::string& relative) {
  if (HasScheme(relative)) return relative;
  // "s3://bucket/dir" -> root "s3://bucket", path "/dir"; a local base is all path.
  std::string root;
  std::string path = base;
  if (HasScheme(base)) {
    const size_t slash = base.find('/', base.find("://") + 3);
    root = base.substr(0, slash);
    path = slash == std::string::npos ? "/" : base.substr(slash);
  }
  std::string joined;
  if (!relative.empty() && relative.front() == '/') {
    joined = relative;
  } else if (path.empty()) {
    joined = relative;
  } else {
    joined = absl::StrCat(path, "/", relative);
  }
  const bool absolute = !joined.empty() && joined.front() == '/';
  std::vector<absl::string_view> segments;
  for (absl::string_view segment : absl::StrSplit(joined, '/')) {
    if (segment.empty() || segment == ".") continue;
    if (segment == "..") {
      if (!segments.empty() && segments.back() != "..") {
        segments.pop_back();
      } else if (!absolute) {
        segments.push_back(segment);  // above a relative base: kept, as a path would
      }
      continue;
    }
    segments.push_back(segment);
  }
  return absl::StrCat(root, absolute ? "/" : "", absl::StrJoin(segments, "/"));
}

absl::StatusOr<std::vector<ShardIndexEntry>> ParseShardIndex(absl::string_view json,
                                                             const std::string& index_location) {
  Value root;
  google::protobuf::util::JsonParseOptions options;
  if (const auto parsed =
          google::protobuf::util::JsonStringToMessage(std::string(json), &root, options);
      !parsed.ok()) {
    return IndexError(index_location,
                      absl::StrCat("is not JSON (", std::string(parsed.message()), ")"));
  }
  if (root.kind_case() != Value::kStructValue) {
    return IndexError(index_location, "is not a JSON object");
  }
  if (const Value* version = Field(root, "wids_version");
      version != nullptr &&
      !(version->kind_case() == Value::kNumberValue && version->number_value() == 1)) {
    return IndexError(index_location, "has a wids_version other than 1");
  }
  if (Field(root, "datasets") != nullptr) {
    return IndexError(index_location,
                      "names sub-datasets (\"datasets\"), which ferry does not follow; list "
                      "their shards in its one \"shardlist\"");
  }
  const Value* list = Field(root, "shardlist");
  if (list == nullptr || list->kind_case() != Value::kListValue ||
      list->list_value().values().empty()) {
    return IndexError(index_location, "has no \"shardlist\" of shards");
  }
  std::string base = index_location.substr(
      0, index_location.rfind('/') == std::string::npos ? 0 : index_location.rfind('/'));
  if (const Value* b = Field(root, "base"); b != nullptr) {
    if (b->kind_case() != Value::kStringValue || b->string_value().empty()) {
      return IndexError(index_location, "has a \"base\" that is not a location");
    }
    base = ResolveShardLocation(base, b->string_value());
  }
  std::vector<ShardIndexEntry> entries;
  entries.reserve(list->list_value().values_size());
  for (int i = 0; i < list->list_value().values_size(); ++i) {
    const Value& shard = list->list_value().values(i);
    const Value* url = Field(shard, "url");
    const Value* samples = Field(shard, "nsamples");
    if (url == nullptr || url->kind_case() != Value::kStringValue || url->string_value().empty()) {
      return IndexError(index_location, absl::StrCat("has shardlist[", i, "] without a \"url\""));
    }
    const double n = samples != nullptr && samples->kind_case() == Value::kNumberValue
                         ? samples->number_value()
                         : -1;
    if (!(n >= 0 && n <= 9007199254740992.0 && std::floor(n) == n)) {
      return IndexError(index_location, absl::StrCat("has shardlist[", i, "] ('",
                                                     url->string_value().substr(0, 256),
                                                     "') without a whole \"nsamples\" >= 0"));
    }
    entries.push_back(
        ShardIndexEntry{ResolveShardLocation(base, url->string_value()), static_cast<uint64_t>(n)});
  }
  return entries;
}

absl::StatusOr<std::vector<ShardIndexEntry>> ReadShardIndex(const std::string& index_location,
                                                            const DatasetFs& fs) {
  auto read_error = [&](const absl::Status& status) {
    return absl::Status(status.code(), absl::StrCat("cannot read shard index '", index_location,
                                                    "': ", status.message()));
  };
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> file = fs.OpenFile(index_location);
  if (!file.ok()) return read_error(file.status());
  if ((*file)->size() > kMaxShardIndexBytes) {
    return IndexError(index_location, absl::StrCat("is ", (*file)->size(), " bytes, over the ",
                                                   kMaxShardIndexBytes, " a shard index may be"));
  }
  std::string json((*file)->size(), '\0');
  absl::StatusOr<size_t> n =
      ReadUpTo(**file, 0, absl::MakeSpan(reinterpret_cast<uint8_t*>(json.data()), json.size()));
  if (!n.ok()) return read_error(n.status());
  json.resize(*n);
  return ParseShardIndex(json, index_location);
}

}  // namespace ferry
