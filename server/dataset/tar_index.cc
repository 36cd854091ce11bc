#include "server/dataset/tar_index.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ferry {
namespace {

// Field offsets in a header block (POSIX ustar; GNU shares the first 345 bytes).
constexpr size_t kNameOffset = 0, kNameSize = 100;
constexpr size_t kSizeOffset = 124, kSizeSize = 12;
constexpr size_t kChecksumOffset = 148, kChecksumSize = 8;
constexpr size_t kTypeOffset = 156;
constexpr size_t kMagicOffset = 257;
constexpr size_t kPrefixOffset = 345, kPrefixSize = 155;
// Old GNU sparse headers: "isextended" in the header and in each extension block.
constexpr size_t kGnuSparseExtendedOffset = 482;
constexpr size_t kSparseBlockExtendedOffset = 504;

// A pax or long-name payload larger than this is not a real archive's (PATH_MAX is 4096).
constexpr uint64_t kMaxMetaBytes = 1 << 20;

using Block = std::array<uint8_t, kTarBlockSize>;

uint64_t RoundUpToBlock(uint64_t n) {
  return (n + kTarBlockSize - 1) / kTarBlockSize * kTarBlockSize;
}

// The bytes of a fixed-width text field up to its first NUL.
absl::string_view FieldText(const uint8_t* field, size_t width) {
  const char* p = reinterpret_cast<const char*>(field);
  return absl::string_view(p, strnlen(p, width));
}

// Octal text as tar writes it: optional leading spaces, digits, then NUL/space padding. An
// empty field is 0 (as GNU tar and Python's tarfile read it).
std::optional<uint64_t> ParseOctal(absl::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '7') return std::nullopt;
    if (value > (UINT64_MAX >> 3)) return std::nullopt;
    value = (value << 3) | static_cast<uint64_t>(c - '0');
  }
  return value;
}

// A numeric header field: octal text, or GNU base-256 (first byte 0x80 positive, 0xff
// negative; its other bits unused, as Python's tarfile reads it). Negative values and values
// beyond 64 bits are rejected.
std::optional<uint64_t> ParseNumber(const uint8_t* field, size_t width) {
  if (field[0] == 0x80 || field[0] == 0xff) {
    if (field[0] == 0xff) return std::nullopt;
    uint64_t value = 0;
    for (size_t i = 1; i < width; ++i) {
      if (value > (UINT64_MAX >> 8)) return std::nullopt;
      value = (value << 8) | field[i];
    }
    return value;
  }
  return ParseOctal(FieldText(field, width));
}

std::optional<uint64_t> ParseDecimal(absl::string_view text) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (value > (UINT64_MAX - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

bool IsZeroBlock(const Block& block) {
  return std::all_of(block.begin(), block.end(), [](uint8_t b) { return b == 0; });
}

// Verifies the header checksum: the sum of the block's bytes with the checksum field read as
// spaces. Some old writers summed signed chars; both are accepted, as GNU tar does.
bool ChecksumMatches(const Block& block, std::string* why) {
  const std::optional<uint64_t> stored =
      ParseOctal(FieldText(&block[kChecksumOffset], kChecksumSize));
  if (!stored.has_value()) {
    *why = "checksum field is not an octal number";
    return false;
  }
  int64_t unsigned_sum = 0;
  int64_t signed_sum = 0;
  for (size_t i = 0; i < kTarBlockSize; ++i) {
    const bool in_field = i >= kChecksumOffset && i < kChecksumOffset + kChecksumSize;
    const uint8_t b = in_field ? uint8_t{' '} : block[i];
    unsigned_sum += b;
    signed_sum += static_cast<int8_t>(b);
  }
  if (static_cast<int64_t>(*stored) == unsigned_sum ||
      static_cast<int64_t>(*stored) == signed_sum) {
    return true;
  }
  *why = absl::StrCat("checksum mismatch (stored ", *stored, ", computed ", unsigned_sum,
                      "); the header is damaged or this is not a tar file");
  return false;
}

// Overrides a pax extended header sets for the next member.
struct PaxOverrides {
  std::optional<std::string> path;
  std::optional<uint64_t> size;
  bool sparse = false;
};

// Parses "<length> <key>=<value>\n" records; a NUL ends the list (padding).
bool ParsePaxRecords(absl::string_view data, PaxOverrides* pax, std::string* why) {
  size_t pos = 0;
  while (pos < data.size() && data[pos] != '\0') {
    const size_t space = data.find(' ', pos);
    if (space == absl::string_view::npos || space == pos) {
      *why = absl::StrCat("pax record at payload byte ", pos, " has no length");
      return false;
    }
    const std::optional<uint64_t> length = ParseDecimal(data.substr(pos, space - pos));
    if (!length.has_value() || *length <= space - pos + 1 || *length > data.size() - pos) {
      *why = absl::StrCat("pax record at payload byte ", pos, " has a bad length '",
                          data.substr(pos, space - pos), "'");
      return false;
    }
    const absl::string_view record = data.substr(pos, *length);
    if (record.back() != '\n') {
      *why = absl::StrCat("pax record at payload byte ", pos, " does not end in a newline");
      return false;
    }
    const absl::string_view body =
        record.substr(space - pos + 1, record.size() - (space - pos + 1) - 1);
    const size_t eq = body.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      *why = absl::StrCat("pax record at payload byte ", pos, " has no key=value");
      return false;
    }
    const absl::string_view key = body.substr(0, eq);
    const absl::string_view value = body.substr(eq + 1);
    if (key == "path") {
      pax->path = std::string(value);
    } else if (key == "size") {
      pax->size = ParseDecimal(value);
      if (!pax->size.has_value()) {
        *why = absl::StrCat("pax size '", value.substr(0, 32), "' is not a decimal number");
        return false;
      }
    } else if (absl::StartsWith(key, "GNU.sparse.")) {
      pax->sparse = true;
    }
    pos += *length;
  }
  return true;
}

class MemoryTarReader final : public TarReader {
 public:
  explicit MemoryTarReader(absl::Span<const uint8_t> bytes) : bytes_(bytes) {}
  uint64_t size() const override { return bytes_.size(); }
  absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> out) const override {
    std::memcpy(out.data(), bytes_.data() + offset, out.size());
    return absl::OkStatus();
  }

 private:
  absl::Span<const uint8_t> bytes_;
};

class FileTarReader final : public TarReader {
 public:
  explicit FileTarReader(const RandomAccessFile& file) : file_(file) {}
  uint64_t size() const override { return file_.size(); }
  absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> out) const override {
    absl::StatusOr<size_t> n = ReadUpTo(file_, offset, out);
    if (!n.ok()) return n.status();
    if (*n < out.size()) {
      return absl::DataLossError(absl::StrCat("the file is shorter than the ", file_.size(),
                                              " bytes it had when opened (it changed "
                                              "while being indexed)"));
    }
    return absl::OkStatus();
  }

 private:
  const RandomAccessFile& file_;
};

// One pass over the headers of an archive.
class Scanner {
 public:
  Scanner(const std::string& shard, const TarReader& reader)
      : shard_(shard), reader_(reader), size_(reader.size()) {}

  absl::StatusOr<TarIndex> Run();

 private:
  absl::Status Corrupt(uint64_t offset, absl::string_view what) const {
    return absl::DataLossError(
        absl::StrCat("corrupt tar header in '", shard_, "' at byte ", offset, ": ", what));
  }
  absl::Status Read(uint64_t offset, absl::Span<uint8_t> out) const {
    absl::Status s = reader_.ReadAt(offset, out);
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat("cannot read tar shard '", shard_, "' at byte ",
                                               offset, ": ", s.message()));
  }
  // True when `bytes` bytes starting at `offset` lie inside the file.
  bool Fits(uint64_t offset, uint64_t bytes) const {
    return offset <= size_ && bytes <= size_ - offset;
  }
  void Truncate(uint64_t at, std::string member) {
    index_.truncated = true;
    index_.truncated_at = at;
    index_.truncated_member = std::move(member);
  }

  const std::string& shard_;
  const TarReader& reader_;
  const uint64_t size_;
  TarIndex index_;
};

absl::StatusOr<TarIndex> Scanner::Run() {
  index_.file_size = size_;
  Block block;
  std::string payload;
  PaxOverrides pax;
  std::optional<std::string> long_name;
  // First header of the member being assembled (its pax or long-name header, if any).
  constexpr uint64_t kNoMember = UINT64_MAX;
  uint64_t member_start = kNoMember;
  uint64_t offset = 0;
  while (offset < size_) {
    if (!Fits(offset, kTarBlockSize)) {
      Truncate(member_start != kNoMember ? member_start : offset, "");
      break;
    }
    absl::Status read = Read(offset, absl::MakeSpan(block));
    if (!read.ok()) return read;
    if (IsZeroBlock(block)) break;  // end-of-archive marker
    std::string why;
    if (!ChecksumMatches(block, &why)) return Corrupt(offset, why);
    const std::optional<uint64_t> header_size = ParseNumber(&block[kSizeOffset], kSizeSize);
    if (!header_size.has_value()) {
      return Corrupt(offset, absl::StrCat("size field '", FieldText(&block[kSizeOffset], kSizeSize),
                                          "' is not an octal or base-256 number"));
    }
    if (member_start == kNoMember) member_start = offset;
    const char type = static_cast<char>(block[kTypeOffset]);
    const uint64_t data_offset = offset + kTarBlockSize;

    // Headers that describe the next member.
    if (type == 'x' || type == 'X' || type == 'L') {
      if (*header_size > kMaxMetaBytes) {
        return Corrupt(
            offset, absl::StrCat(type == 'L' ? "GNU long name" : "pax header", " of ", *header_size,
                                 " bytes (more than ", kMaxMetaBytes, ")"));
      }
      if (!Fits(data_offset, *header_size)) {
        Truncate(member_start, "");
        break;
      }
      payload.resize(*header_size);
      read = Read(data_offset,
                  absl::MakeSpan(reinterpret_cast<uint8_t*>(payload.data()), payload.size()));
      if (!read.ok()) return read;
      if (type == 'L') {
        long_name = std::string(payload.c_str());  // up to the first NUL
      } else if (!ParsePaxRecords(payload, &pax, &why)) {
        return Corrupt(offset, why);
      }
      offset = data_offset + RoundUpToBlock(*header_size);
      continue;
    }
    if (type == 'g' || type == 'K') {  // global pax keys and long link names: unused
      if (!Fits(data_offset, *header_size)) {
        Truncate(member_start, "");
        break;
      }
      offset = data_offset + RoundUpToBlock(*header_size);
      // A global header is part of no member (unless one has already begun).
      if (type == 'g' && member_start == offset) member_start = kNoMember;
      continue;
    }

    // A member header: resolve its name and where its data ends.
    std::string name;
    if (pax.path.has_value()) {
      name = std::move(*pax.path);
    } else if (long_name.has_value()) {
      name = std::move(*long_name);
    } else {
      name = std::string(FieldText(&block[kNameOffset], kNameSize));
      const bool posix = std::memcmp(&block[kMagicOffset], "ustar\0", 6) == 0;
      const absl::string_view prefix = FieldText(&block[kPrefixOffset], kPrefixSize);
      if (posix && !prefix.empty()) name = absl::StrCat(prefix, "/", name);
    }
    const uint64_t size = pax.size.value_or(*header_size);
    const bool sparse = pax.sparse;
    pax = PaxOverrides();
    long_name.reset();
    const uint64_t start = member_start;
    member_start = kNoMember;

    uint64_t data_begin = data_offset;
    bool regular = false;
    bool has_data = true;
    switch (type) {
      case '0':
      case '7':
        regular = !sparse;
        break;
      case '\0':
        // Old V7 archives mark directories by a trailing slash only.
        regular = !sparse && !(!name.empty() && name.back() == '/');
        has_data = regular || sparse;
        break;
      case '1':
      case '2':
      case '3':
      case '4':
      case '5':
      case '6':
        has_data = false;  // links, devices, directories, FIFOs: no data blocks
        break;
      case 'S': {
        // Old GNU sparse: extension blocks of the sparse map come before the data.
        bool extended = block[kGnuSparseExtendedOffset] != 0;
        while (extended) {
          if (!Fits(data_begin, kTarBlockSize)) break;
          read = Read(data_begin, absl::MakeSpan(block));
          if (!read.ok()) return read;
          extended = block[kSparseBlockExtendedOffset] != 0;
          data_begin += kTarBlockSize;
        }
        if (extended) {
          Truncate(start, name);
          return std::move(index_);
        }
        break;
      }
      default:
        break;  // unknown types: skipped, their data too (as Python's tarfile does)
    }
    if (!has_data) {
      offset = data_offset;
      continue;
    }
    if (!Fits(data_begin, size)) {
      Truncate(start, std::move(name));
      break;
    }
    if (regular) {
      index_.members.push_back(TarMember{.name = std::move(name),
                                         .header_offset = start,
                                         .data_offset = data_begin,
                                         .size = size});
    }
    offset = data_begin + RoundUpToBlock(size);
  }
  return std::move(index_);
}

}  // namespace

absl::StatusOr<TarIndex> IndexTar(const std::string& shard, const TarReader& reader) {
  return Scanner(shard, reader).Run();
}

absl::StatusOr<TarIndex> IndexTarBytes(const std::string& shard, absl::Span<const uint8_t> bytes) {
  return IndexTar(shard, MemoryTarReader(bytes));
}

absl::StatusOr<TarIndex> IndexTarFile(const std::string& path, const DatasetFs& fs) {
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> file = fs.OpenFile(path);
  if (!file.ok()) {
    if (file.status().code() == absl::StatusCode::kInvalidArgument) {
      return absl::InvalidArgumentError(
          absl::StrCat("tar shard '", path, "' is not a regular file"));
    }
    return file.status();
  }
  absl::StatusOr<TarIndex> index = IndexTar(path, FileTarReader(**file));
  if (index.ok()) index->identity = (*file)->identity();
  return index;
}

}  // namespace ferry
