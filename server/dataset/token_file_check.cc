#include "server/dataset/token_file_check.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/dataset/mapped_file.h"

namespace ferry {
namespace {

bool StartsWith(absl::Span<const uint8_t> bytes, size_t offset, std::string_view magic) {
  return bytes.size() >= offset + magic.size() &&
         std::memcmp(bytes.data() + offset, magic.data(), magic.size()) == 0;
}

// A byte that text (ASCII or UTF-8) does not hold: C0 controls but tab, line feed, vertical
// tab, form feed and carriage return; DEL.
bool IsBinaryByte(uint8_t b) {
  return (b < 0x20 && b != '\t' && b != '\n' && b != '\v' && b != '\f' && b != '\r') || b == 0x7f;
}

// What the head of a file shows it to be, and what to do about it; empty when it may be
// raw token ids.
std::string Recognise(absl::Span<const uint8_t> head) {
  using namespace std::string_view_literals;
  if (StartsWith(head, 0, "\x93NUMPY"sv)) {
    return "a NumPy .npy file (it starts with the .npy magic): read it with ferry.Npy "
           "(dataset.npy), or write the raw ids with array.tofile()";
  }
  if (StartsWith(head, 0, "MMIDIDX\0\0"sv)) {
    return "a Megatron-LM index (.idx): give the path without .bin/.idx to "
           "ferry.IndexedDataset (dataset.indexed)";
  }
  if (StartsWith(head, 257, "ustar"sv)) {
    return "a tar archive: read WebDataset shards with ferry.WebDataset (dataset.webdataset)";
  }
  if (StartsWith(head, 0, "\x28\xb5\x2f\xfd"sv)) {
    return "zstd-compressed: decompress it first (zstd -d)";
  }
  if (StartsWith(head, 0,
                 "\xfd"
                 "7zXZ\0"sv)) {
    return "xz-compressed: decompress it first (xz -d)";
  }
  if (head.size() >= kMinTextVerdictBytes && std::none_of(head.begin(), head.end(), IsBinaryByte)) {
    return absl::StrCat(
        "text (none of its first ", head.size(),
        " bytes is a control byte, which raw uint16/uint32 ids always hold): tokenize it "
        "first and write the ids as little-endian integers, or use an indexed dataset made "
        "by Megatron-LM's preprocess_data.py (ferry.IndexedDataset)");
  }
  return "";
}

}  // namespace

absl::Status CheckLooksLikeTokens(absl::string_view what, absl::string_view path,
                                  absl::Span<const uint8_t> bytes) {
  const std::string looks = Recognise(bytes.subspan(0, std::min(bytes.size(), kTokenCheckBytes)));
  if (looks.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " '", path, "' does not hold raw token ids: it looks like ", looks));
}

absl::Status CheckMappedLooksLikeTokens(absl::string_view what, const MappedFile& file) {
  const absl::Span<const uint8_t> bytes = file.bytes();
  std::vector<uint8_t> head(std::min(bytes.size(), kTokenCheckBytes));
  if (head.empty()) return absl::OkStatus();  // an empty file: the size checks say so
  absl::Status read = file.Read(bytes.data(), head.size(),
                                [&] { std::memcpy(head.data(), bytes.data(), head.size()); });
  if (!read.ok()) return read;
  return CheckLooksLikeTokens(what, file.path(), head);
}

}  // namespace ferry
