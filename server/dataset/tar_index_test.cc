// The tar indexer: hand-built archives for each format feature and each kind of damage,
// libarchive as an oracle on generated archives, and a mutation fuzz.
#include "server/dataset/tar_index.h"

#include <archive.h>
#include <archive_entry.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

constexpr size_t kBlock = 512;

// Writes archives block by block, the way tar implementations lay them out, with knobs to
// produce each header variant and each kind of damage.
class TarBuilder {
 public:
  enum class Magic { kPosix, kGnu, kV7 };

  struct Header {
    std::string name;
    uint64_t size = 0;
    char type = '0';
    std::string prefix;  // POSIX magic only
    Magic magic = Magic::kPosix;
    bool base256_size = false;
    std::string size_text;  // raw size field text, overriding `size` when set
    bool bad_checksum = false;
    bool extended_sparse = false;  // GNU 'S': set "isextended"
  };

  // Appends one header block; returns its offset.
  size_t AddHeader(const Header& h) {
    const size_t at = bytes_.size();
    uint8_t block[kBlock] = {};
    std::memcpy(block, h.name.data(), std::min<size_t>(h.name.size(), 100));
    std::memcpy(block + 100, "0000644", 8);
    std::memcpy(block + 108, "0001750", 8);
    std::memcpy(block + 116, "0001750", 8);
    if (!h.size_text.empty()) {
      std::memcpy(block + 124, h.size_text.data(), std::min<size_t>(h.size_text.size(), 12));
    } else if (h.base256_size) {
      block[124] = 0x80;
      for (int i = 0; i < 8; ++i) block[135 - i] = static_cast<uint8_t>(h.size >> (8 * i));
    } else {
      std::snprintf(reinterpret_cast<char*>(block + 124), 12, "%011llo",
                    static_cast<unsigned long long>(h.size));
    }
    std::memcpy(block + 136, "14672535164", 12);  // mtime
    block[156] = static_cast<uint8_t>(h.type);
    if (h.magic == Magic::kPosix) {
      std::memcpy(block + 257,
                  "ustar\0"
                  "00",
                  8);
      std::memcpy(block + 345, h.prefix.data(), std::min<size_t>(h.prefix.size(), 155));
    } else if (h.magic == Magic::kGnu) {
      std::memcpy(block + 257, "ustar  \0", 8);
    }
    if (h.extended_sparse) block[482] = 1;
    FixChecksum(block);
    if (h.bad_checksum) block[148] = '7';
    bytes_.insert(bytes_.end(), block, block + kBlock);
    return at;
  }

  // Data blocks: `data`, zero-padded to a whole block.
  void AddData(const std::string& data) {
    bytes_.insert(bytes_.end(), data.begin(), data.end());
    bytes_.resize(RoundUp(bytes_.size()), 0);
  }

  // A regular file; returns its header's offset.
  size_t AddFile(const std::string& name, const std::string& data, Magic magic = Magic::kPosix) {
    const size_t at = AddHeader({.name = name, .size = data.size(), .magic = magic});
    AddData(data);
    return at;
  }

  // A pax extended header ('x' or 'g') holding `records` ("key=value" each).
  size_t AddPax(const std::vector<std::string>& records, char type = 'x') {
    std::string payload;
    for (const std::string& r : records) payload += PaxRecord(r);
    const size_t at = AddHeader({.name = "PaxHeaders/x", .size = payload.size(), .type = type});
    AddData(payload);
    return at;
  }

  // A GNU long-name header for the next member.
  size_t AddLongName(const std::string& name) {
    const size_t at = AddHeader(
        {.name = "././@LongLink", .size = name.size() + 1, .type = 'L', .magic = Magic::kGnu});
    AddData(name + std::string(1, '\0'));
    return at;
  }

  void End() { bytes_.resize(bytes_.size() + 2 * kBlock, 0); }

  std::vector<uint8_t>& bytes() { return bytes_; }

  static std::string PaxRecord(const std::string& key_value) {
    // The length counts itself: find the fixed point.
    size_t length = key_value.size() + 3;
    while (std::to_string(length).size() + 1 + key_value.size() + 1 != length) {
      length = std::to_string(length).size() + 1 + key_value.size() + 1;
    }
    return absl::StrCat(length, " ", key_value, "\n");
  }

  static void FixChecksum(uint8_t* block) {
    std::memset(block + 148, ' ', 8);
    unsigned sum = 0;
    for (size_t i = 0; i < kBlock; ++i) sum += block[i];
    std::snprintf(reinterpret_cast<char*>(block + 148), 8, "%06o", sum);
    block[155] = ' ';
  }

  static size_t RoundUp(size_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

 private:
  std::vector<uint8_t> bytes_;
};

std::string ContentOf(const std::vector<uint8_t>& tar, const TarMember& m) {
  return std::string(reinterpret_cast<const char*>(tar.data()) + m.data_offset, m.size);
}

struct NameAndContent {
  std::string name;
  std::string content;
  bool operator==(const NameAndContent& o) const { return name == o.name && content == o.content; }
};

std::vector<NameAndContent> Listing(const std::vector<uint8_t>& tar, const TarIndex& index) {
  std::vector<NameAndContent> out;
  for (const TarMember& m : index.members) out.push_back({m.name, ContentOf(tar, m)});
  return out;
}

void PrintTo(const NameAndContent& n, std::ostream* os) {
  *os << "{" << n.name << ", " << n.content.size() << " bytes}";
}

TarIndex IndexOk(const std::vector<uint8_t>& tar) {
  absl::StatusOr<TarIndex> index = IndexTarBytes("mem.tar", tar);
  EXPECT_TRUE(index.ok()) << index.status();
  return index.ok() ? *std::move(index) : TarIndex();
}

TEST(TarIndexTest, UstarMembersWithOffsets) {
  TarBuilder tar;
  tar.AddFile("n01_0001.jpg", std::string(700, 'a'));
  tar.AddFile("n01_0001.cls", "3\n");
  tar.AddFile("empty.txt", "");
  tar.AddHeader({.name = "b.jpg", .size = 4, .prefix = "deep/dir"});
  tar.AddData("BBBB");
  tar.End();
  const TarIndex index = IndexOk(tar.bytes());
  ASSERT_EQ(index.members.size(), 4u);
  EXPECT_EQ(index.members[0].name, "n01_0001.jpg");
  EXPECT_EQ(index.members[0].header_offset, 0u);
  EXPECT_EQ(index.members[0].data_offset, 512u);
  EXPECT_EQ(index.members[0].size, 700u);
  EXPECT_EQ(index.members[1].header_offset, 512u + 1024u);
  EXPECT_EQ(index.members[1].data_offset, 2048u);
  EXPECT_EQ(ContentOf(tar.bytes(), index.members[1]), "3\n");
  EXPECT_EQ(index.members[2].size, 0u);
  EXPECT_EQ(index.members[3].name, "deep/dir/b.jpg");
  EXPECT_EQ(ContentOf(tar.bytes(), index.members[3]), "BBBB");
  EXPECT_FALSE(index.truncated);
  EXPECT_EQ(index.file_size, tar.bytes().size());
}

TEST(TarIndexTest, PaxPathAndSizeOverrideTheHeader) {
  const std::string long_name = std::string(150, 'p') + "/" + std::string(120, 'q') + ".jpg";
  TarBuilder tar;
  tar.AddPax({"mtime=1700000000.5", "path=" + long_name, "SCHILY.xattr.user.x=1"});
  tar.AddFile("truncated-name-in-ustar.jpg", "pixels");
  // The size override: the header says 0, pax says 9.
  tar.AddPax({"size=9"});
  tar.AddHeader({.name = "sized.bin", .size = 0});
  tar.AddData("123456789");
  tar.AddFile("after.txt", "z");
  tar.End();
  const TarIndex index = IndexOk(tar.bytes());
  EXPECT_THAT(Listing(tar.bytes(), index),
              ::testing::ElementsAre(NameAndContent{long_name, "pixels"},
                                     NameAndContent{"sized.bin", "123456789"},
                                     NameAndContent{"after.txt", "z"}));
  EXPECT_EQ(index.members[0].header_offset, 0u);  // the member starts at its pax header
}

TEST(TarIndexTest, GnuLongNamesAndGlobalHeaders) {
  const std::string long_name = "shards/" + std::string(200, 'n') + ".cls";
  TarBuilder tar;
  tar.AddPax({"comment=global keys are ignored", "path=not-a-member"}, 'g');
  tar.AddLongName(long_name);
  tar.AddFile("././@LongLink-truncated", "7", TarBuilder::Magic::kGnu);
  tar.AddHeader({.name = "link", .size = 10, .type = 'K', .magic = TarBuilder::Magic::kGnu});
  tar.AddData("0123456789");
  tar.AddFile("short.jpg", "j", TarBuilder::Magic::kGnu);
  tar.End();
  const TarIndex index = IndexOk(tar.bytes());
  EXPECT_THAT(
      Listing(tar.bytes(), index),
      ::testing::ElementsAre(NameAndContent{long_name, "7"}, NameAndContent{"short.jpg", "j"}));
}

TEST(TarIndexTest, SkipsDirectoriesLinksAndOtherTypes) {
  TarBuilder tar;
  tar.AddHeader({.name = "dir/", .type = '5'});
  tar.AddHeader({.name = "v7dir/", .type = '\0', .magic = TarBuilder::Magic::kV7});
  tar.AddHeader({.name = "sym.jpg", .type = '2'});
  tar.AddHeader({.name = "hard.jpg", .type = '1'});
  tar.AddHeader({.name = "fifo", .type = '6'});
  tar.AddHeader({.name = "dumpdir", .size = 5, .type = 'D', .magic = TarBuilder::Magic::kGnu});
  tar.AddData("abcde");
  // Old GNU sparse with one extension block before its data.
  tar.AddHeader({.name = "sparse",
                 .size = 3,
                 .type = 'S',
                 .magic = TarBuilder::Magic::kGnu,
                 .extended_sparse = true});
  tar.AddData(std::string(kBlock, '\0'));  // the extension block, isextended = 0
  tar.AddData("xyz");
  tar.AddFile("v7.jpg", "old", TarBuilder::Magic::kV7);
  tar.AddHeader({.name = "contiguous.jpg", .size = 2, .type = '7'});
  tar.AddData("cc");
  tar.End();
  const TarIndex index = IndexOk(tar.bytes());
  ASSERT_EQ(index.members.size(), 2u);
  EXPECT_EQ(index.members[0].name, "v7.jpg");
  EXPECT_EQ(ContentOf(tar.bytes(), index.members[0]), "old");
  EXPECT_EQ(index.members[1].name, "contiguous.jpg");
  EXPECT_EQ(ContentOf(tar.bytes(), index.members[1]), "cc");
}

TEST(TarIndexTest, Base256Size) {
  TarBuilder tar;
  tar.AddHeader({.name = "big.bin", .size = 600, .base256_size = true});
  tar.AddData(std::string(600, 'b'));
  tar.AddFile("next.txt", "n");
  tar.End();
  const TarIndex index = IndexOk(tar.bytes());
  ASSERT_EQ(index.members.size(), 2u);
  EXPECT_EQ(index.members[0].size, 600u);
  EXPECT_EQ(index.members[1].name, "next.txt");
}

TEST(TarIndexTest, EndsAtZeroBlockOrEof) {
  TarBuilder tar;
  tar.AddFile("a.jpg", "a");
  // No end-of-archive marker: EOF ends it.
  EXPECT_EQ(IndexOk(tar.bytes()).members.size(), 1u);
  // A single zero block, then junk that is not a header: the junk is never read.
  tar.bytes().resize(tar.bytes().size() + kBlock, 0);
  tar.bytes().resize(tar.bytes().size() + kBlock, 0x5a);
  const TarIndex index = IndexOk(tar.bytes());
  EXPECT_EQ(index.members.size(), 1u);
  EXPECT_FALSE(index.truncated);
  // An empty file is an empty archive.
  EXPECT_TRUE(IndexOk({}).members.empty());
}

TEST(TarIndexTest, TruncatedLastMemberIsDroppedNotAnError) {
  TarBuilder tar;
  tar.AddFile("0.jpg", std::string(1000, '0'));
  tar.AddFile("0.cls", "0");
  const size_t cut_header = tar.AddFile("1.jpg", std::string(5000, '1'));
  tar.AddFile("1.cls", "1");
  tar.End();
  std::vector<uint8_t> cut(tar.bytes().begin(), tar.bytes().begin() + cut_header + 512 + 4000);
  absl::StatusOr<TarIndex> index = IndexTarBytes("cut.tar", cut);
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->members.size(), 2u);
  EXPECT_EQ(index->members[1].name, "0.cls");
  EXPECT_TRUE(index->truncated);
  EXPECT_EQ(index->truncated_at, cut_header);
  EXPECT_EQ(index->truncated_member, "1.jpg");

  // Cut inside a header block, and inside a pax payload.
  std::vector<uint8_t> mid_header(tar.bytes().begin(), tar.bytes().begin() + cut_header + 100);
  index = IndexTarBytes("cut.tar", mid_header);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->members.size(), 2u);
  EXPECT_TRUE(index->truncated);
  EXPECT_EQ(index->truncated_at, cut_header);

  TarBuilder pax;
  pax.AddFile("ok.jpg", "ok");
  const size_t pax_at = pax.AddPax({"path=" + std::string(300, 'x') + ".jpg"});
  std::vector<uint8_t> mid_pax(pax.bytes().begin(), pax.bytes().begin() + pax_at + 600);
  index = IndexTarBytes("cut.tar", mid_pax);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->members.size(), 1u);
  EXPECT_TRUE(index->truncated);
  EXPECT_EQ(index->truncated_at, pax_at);

  // The data complete but its padding missing is not truncation.
  TarBuilder unpadded;
  unpadded.AddFile("a.jpg", "abc");
  unpadded.bytes().resize(512 + 3);
  index = IndexTarBytes("unpadded.tar", unpadded.bytes());
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(index->members.size(), 1u);
  EXPECT_FALSE(index->truncated);
}

TEST(TarIndexTest, CorruptHeadersNameShardAndOffset) {
  struct Case {
    std::string label;
    TarBuilder::Header header;
    std::string message;
  };
  const Case cases[] = {
      {"checksum", {.name = "x.jpg", .size = 1, .bad_checksum = true}, "checksum mismatch"},
      {"octal size",
       {.name = "x.jpg", .size_text = "00000000x12"},
       "size field '00000000x12' is not an octal or base-256 number"},
      {"negative base-256",
       {.name = "x.jpg", .size_text = "\xff\xff\xff\xff\xff\xff"},
       "is not an octal or base-256 number"},
      {"huge long name",
       {.name = "L", .size = 5u << 20, .type = 'L'},
       "GNU long name of 5242880 bytes"},
  };
  for (const Case& c : cases) {
    TarBuilder tar;
    tar.AddFile("fine.jpg", std::string(600, 'f'));
    tar.AddHeader(c.header);
    tar.AddData(std::string(c.header.size < 4096 ? c.header.size : 0, 'd'));
    tar.End();
    absl::StatusOr<TarIndex> index = IndexTarBytes("/data/shard-7.tar", tar.bytes());
    EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss) << c.label;
    EXPECT_THAT(index.status().message(),
                HasSubstr("corrupt tar header in '/data/shard-7.tar' at byte 1536"))
        << c.label;
    EXPECT_THAT(index.status().message(), HasSubstr(c.message)) << c.label;
  }

  // Not a tar at all.
  std::vector<uint8_t> text(2000, 'x');
  absl::StatusOr<TarIndex> index = IndexTarBytes("notes.txt", text);
  EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(index.status().message(), HasSubstr("'notes.txt' at byte 0: checksum"));
}

TEST(TarIndexTest, MalformedPaxRecordsAreCorrupt) {
  const std::vector<std::string> payloads = {
      "garbage without length\n",
      "99 path=too-long-a-length\n",
      "12 path=abc.",      // no newline
      "9 nokey\n\n",       // no '='
      "15 size=12x456\n",  // not a number
      "3 \n",
  };
  for (const std::string& payload : payloads) {
    TarBuilder tar;
    tar.AddHeader({.name = "pax", .size = payload.size(), .type = 'x'});
    tar.AddData(payload);
    tar.AddFile("a.jpg", "a");
    tar.End();
    absl::StatusOr<TarIndex> index = IndexTarBytes("p.tar", tar.bytes());
    EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss) << payload;
    EXPECT_THAT(index.status().message(), HasSubstr("'p.tar' at byte 0")) << payload;
  }
}

class TempFile {
 public:
  explicit TempFile(const std::vector<uint8_t>& bytes) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ferry_tar_XXXXXX").string();
    const int fd = ::mkstemp(tmpl.data());
    EXPECT_GE(fd, 0);
    path_ = tmpl;
    EXPECT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }
  ~TempFile() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(TarIndexTest, IndexTarFileReadsFilesAndNamesErrors) {
  TarBuilder tar;
  tar.AddFile("a.jpg", "aaa");
  tar.AddFile("a.cls", "1");
  tar.End();
  TempFile file(tar.bytes());
  absl::StatusOr<TarIndex> index = IndexTarFile(file.path());
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_THAT(Listing(tar.bytes(), *index),
              ::testing::ElementsAre(NameAndContent{"a.jpg", "aaa"}, NameAndContent{"a.cls", "1"}));

  index = IndexTarFile("/nonexistent/shard-000.tar");
  EXPECT_EQ(index.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(index.status().message(), "dataset path '/nonexistent/shard-000.tar' does not exist");
  index = IndexTarFile(std::filesystem::temp_directory_path().string());
  EXPECT_EQ(index.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(index.status().message(), HasSubstr("is not a regular file"));
}

// ---------------------------------------------------------------------------------------
// libarchive as an oracle: archives it writes in each tar dialect, read back by it and by
// IndexTar, must list the same regular files with the same contents.

struct OracleEntry {
  std::string name;
  int type = AE_IFREG;
  std::string content;
};

std::vector<uint8_t> WriteWithLibarchive(int format, const std::vector<OracleEntry>& entries) {
  archive* a = archive_write_new();
  EXPECT_EQ(archive_write_set_format(a, format), ARCHIVE_OK) << archive_error_string(a);
  archive_write_set_bytes_in_last_block(a, 1);
  std::vector<uint8_t> buffer(8 << 20);  // far more than these archives need
  size_t used = 0;
  EXPECT_EQ(archive_write_open_memory(a, buffer.data(), buffer.size(), &used), ARCHIVE_OK);
  for (const OracleEntry& e : entries) {
    archive_entry* entry = archive_entry_new();
    archive_entry_set_pathname(entry, e.name.c_str());
    archive_entry_set_filetype(entry, static_cast<unsigned>(e.type));
    archive_entry_set_perm(entry, 0644);
    archive_entry_set_mtime(entry, 1700000000, 0);
    if (e.type == AE_IFLNK) archive_entry_set_symlink(entry, "target.jpg");
    archive_entry_set_size(entry,
                           e.type == AE_IFREG ? static_cast<la_int64_t>(e.content.size()) : 0);
    EXPECT_EQ(archive_write_header(a, entry), ARCHIVE_OK)
        << e.name << ": " << archive_error_string(a);
    if (e.type == AE_IFREG && !e.content.empty()) {
      EXPECT_EQ(archive_write_data(a, e.content.data(), e.content.size()),
                static_cast<la_ssize_t>(e.content.size()));
    }
    archive_entry_free(entry);
  }
  EXPECT_EQ(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);
  buffer.resize(used);
  return buffer;
}

std::vector<NameAndContent> ReadWithLibarchive(const std::vector<uint8_t>& tar) {
  std::vector<NameAndContent> out;
  archive* a = archive_read_new();
  archive_read_support_format_tar(a);
  EXPECT_EQ(archive_read_open_memory(a, tar.data(), tar.size()), ARCHIVE_OK);
  archive_entry* entry;
  while (archive_read_next_header(a, &entry) == ARCHIVE_OK) {
    if (archive_entry_filetype(entry) != AE_IFREG || archive_entry_hardlink(entry) != nullptr) {
      continue;
    }
    std::string content(static_cast<size_t>(archive_entry_size(entry)), '\0');
    if (!content.empty()) {
      EXPECT_EQ(archive_read_data(a, content.data(), content.size()),
                static_cast<la_ssize_t>(content.size()));
    }
    out.push_back({archive_entry_pathname(entry), std::move(content)});
  }
  archive_read_free(a);
  return out;
}

TEST(TarIndexOracleTest, MatchesLibarchiveOnGeneratedArchives) {
  std::mt19937_64 rng(20240611);
  const std::pair<int, const char*> formats[] = {
      {ARCHIVE_FORMAT_TAR_USTAR, "ustar"},
      {ARCHIVE_FORMAT_TAR_GNUTAR, "gnutar"},
      {ARCHIVE_FORMAT_TAR_PAX_RESTRICTED, "pax restricted"},
      {ARCHIVE_FORMAT_TAR_PAX_INTERCHANGE, "pax"},
  };
  int compared = 0;
  for (const auto& [format, label] : formats) {
    for (int round = 0; round < 3; ++round) {
      std::vector<OracleEntry> entries;
      const int n = 20 + static_cast<int>(rng() % 40);
      for (int i = 0; i < n; ++i) {
        OracleEntry e;
        const int shape = static_cast<int>(rng() % 10);
        // ustar cannot hold names over 100 bytes unless they split at a '/' into 155 + 100.
        const bool long_ok = format != ARCHIVE_FORMAT_TAR_USTAR;
        std::string dir = shape == 0 ? "class_" + std::to_string(rng() % 5) + "/" : "";
        if (shape == 1 && long_ok) dir = std::string(110 + rng() % 100, 'd') + "/";
        if (shape == 2) dir = std::string(80, 'e') + "/" + std::string(40, 'f') + "/";
        e.name = absl::StrCat(dir, "sample_", i, ".jpg");
        if (shape == 3) e.type = AE_IFDIR, e.name = absl::StrCat("dir", i);
        if (shape == 4) e.type = AE_IFLNK;
        const size_t size = rng() % 3 == 0 ? rng() % 8 : rng() % 3000;
        for (size_t k = 0; e.type == AE_IFREG && k < size; ++k) {
          e.content.push_back(static_cast<char>(rng()));
        }
        entries.push_back(std::move(e));
      }
      const std::vector<uint8_t> tar = WriteWithLibarchive(format, entries);
      const std::vector<NameAndContent> expected = ReadWithLibarchive(tar);
      ASSERT_FALSE(expected.empty()) << label;
      absl::StatusOr<TarIndex> index = IndexTarBytes(label, tar);
      ASSERT_TRUE(index.ok()) << label << ": " << index.status();
      EXPECT_EQ(Listing(tar, *index), expected) << label << " round " << round;
      EXPECT_GT(index->members.size(), entries.size() / 2) << label;
      EXPECT_FALSE(index->truncated) << label;
      ++compared;
    }
  }
  EXPECT_EQ(compared, 12);
}

TEST(TarIndexOracleTest, ReadsOurHandBuiltArchivesLikeLibarchive) {
  TarBuilder tar;
  tar.AddPax({"path=" + std::string(180, 'p') + ".jpg"});
  tar.AddFile("x.jpg", "pax-named");
  tar.AddLongName(std::string(130, 'g') + ".cls");
  tar.AddFile("y.cls", "gnu-named", TarBuilder::Magic::kGnu);
  tar.AddHeader({.name = "dir/", .type = '5'});
  tar.AddHeader({.name = "b.jpg", .size = 3, .prefix = "pre/fix"});
  tar.AddData("pre");
  tar.AddHeader({.name = "big.bin", .size = 700, .base256_size = true});
  tar.AddData(std::string(700, 'B'));
  tar.End();
  EXPECT_EQ(Listing(tar.bytes(), IndexOk(tar.bytes())), ReadWithLibarchive(tar.bytes()));
}

// ---------------------------------------------------------------------------------------
// Mutation fuzz: random damage to a valid archive never crashes the reader, never yields a
// member outside the file or overlapping another, and gives OK or DATA_LOSS.

std::vector<uint8_t> FuzzSeedArchive() {
  TarBuilder tar;
  tar.AddPax({"path=" + std::string(120, 'p') + "/0.jpg", "mtime=1.5"});
  tar.AddFile("0.jpg", std::string(900, 'j'));
  tar.AddFile("0.cls", "0\n");
  tar.AddLongName(std::string(150, 'l') + "/1.jpg");
  tar.AddFile("1.jpg", std::string(1500, 'k'), TarBuilder::Magic::kGnu);
  tar.AddHeader({.name = "dir/", .type = '5'});
  tar.AddPax({"comment=global"}, 'g');
  tar.AddPax({"size=33"});
  tar.AddHeader({.name = "2.jpg", .size = 0});
  tar.AddData(std::string(33, 's'));
  tar.AddHeader({.name = "3.jpg", .size = 513, .base256_size = true});
  tar.AddData(std::string(513, 'b'));
  tar.AddHeader({.name = "sparse",
                 .size = 10,
                 .type = 'S',
                 .magic = TarBuilder::Magic::kGnu,
                 .extended_sparse = true});
  tar.AddData(std::string(kBlock, '\0'));
  tar.AddData(std::string(10, 'x'));
  tar.AddFile("4.cls", "4");
  tar.End();
  return tar.bytes();
}

TEST(TarIndexFuzzTest, MutationsNeverCrashOrEscapeTheFile) {
  const std::vector<uint8_t> seed = FuzzSeedArchive();
  ASSERT_EQ(IndexOk(seed).members.size(), 6u);
  std::mt19937_64 rng(0xfe77c0ffee);
  int ok = 0, corrupt = 0, truncated = 0;
  for (int iteration = 0; iteration < 20000; ++iteration) {
    std::vector<uint8_t> tar = seed;
    const int mutations = 1 + static_cast<int>(rng() % 4);
    std::vector<size_t> touched;
    for (int m = 0; m < mutations && !tar.empty(); ++m) {
      const size_t at = rng() % tar.size();
      switch (rng() % 6) {
        case 0:  // flip bits of a byte
        case 1:
          tar[at] ^= static_cast<uint8_t>(1 + rng() % 255);
          break;
        case 2:  // set a byte to a value tar parsers care about
          tar[at] = "\0 07x\n=\x80\xff/."[rng() % 11];
          break;
        case 3:  // truncate
          tar.resize(at);
          break;
        case 4: {  // insert random bytes
          std::vector<uint8_t> junk(1 + rng() % 700);
          for (uint8_t& b : junk) b = static_cast<uint8_t>(rng());
          tar.insert(tar.begin() + static_cast<std::ptrdiff_t>(at), junk.begin(), junk.end());
          break;
        }
        case 5: {  // delete a range
          const size_t n = std::min<size_t>(1 + rng() % 700, tar.size() - at);
          tar.erase(tar.begin() + static_cast<std::ptrdiff_t>(at),
                    tar.begin() + static_cast<std::ptrdiff_t>(at + n));
          break;
        }
      }
      touched.push_back(at);
    }
    // Half the time, make the damaged blocks' checksums valid again so the damage reaches
    // the field parsers instead of stopping at the checksum.
    if (rng() % 2 == 0) {
      for (size_t at : touched) {
        const size_t block = at / kBlock * kBlock;
        if (block + kBlock <= tar.size()) TarBuilder::FixChecksum(tar.data() + block);
      }
    }
    absl::StatusOr<TarIndex> index = IndexTarBytes("fuzz.tar", tar);
    if (!index.ok()) {
      ASSERT_EQ(index.status().code(), absl::StatusCode::kDataLoss)
          << "iteration " << iteration << ": " << index.status();
      ASSERT_THAT(index.status().message(), HasSubstr("'fuzz.tar' at byte "));
      ++corrupt;
      continue;
    }
    ++ok;
    if (index->truncated) ++truncated;
    ASSERT_EQ(index->file_size, tar.size());
    uint64_t end_of_previous = 0;
    for (const TarMember& m : index->members) {
      ASSERT_LE(m.data_offset, tar.size()) << "iteration " << iteration;
      ASSERT_LE(m.size, tar.size() - m.data_offset) << "iteration " << iteration;
      ASSERT_GE(m.data_offset, m.header_offset + kBlock) << "iteration " << iteration;
      ASSERT_GE(m.header_offset, end_of_previous) << "iteration " << iteration;
      ASSERT_EQ(m.data_offset % kBlock, 0u) << "iteration " << iteration;
      end_of_previous = m.data_offset + m.size;
    }
  }
  std::printf("fuzz: %d indexed (%d of them truncated), %d corrupt\n", ok, truncated, corrupt);
  // Both outcomes must be common, or the fuzz is not exercising the parser.
  EXPECT_GT(ok, 2000);
  EXPECT_GT(corrupt, 2000);
  EXPECT_GT(truncated, 100);
}

}  // namespace
}  // namespace ferry
