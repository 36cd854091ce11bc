#include "server/dataset/indexed_source.h"

#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/dataset/sample_source.h"
#include "testing/recording_fs.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

template <typename T>
void Append(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// A Megatron-LM MMIDIDX v1 pair written the way its _IndexWriter lays it out: documents of
// sequences of uint16 tokens (dtype code 8).
struct Written {
  std::string bin;
  std::string idx;
};
Written MakeIndexed(const std::vector<std::vector<std::vector<uint16_t>>>& documents,
                    bool modes = false, bool int32_tokens = false) {
  Written w;
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers;
  std::vector<int64_t> doc_index = {0};
  for (const auto& doc : documents) {
    for (const auto& seq : doc) {
      pointers.push_back(static_cast<int64_t>(w.bin.size()));
      lengths.push_back(static_cast<int32_t>(seq.size()));
      for (uint16_t t : seq) {
        if (int32_tokens) {
          Append<int32_t>(&w.bin, t == 0xffff ? -1 : t);  // 0xffff stands for a negative id
        } else {
          Append(&w.bin, t);
        }
      }
    }
    doc_index.push_back(static_cast<int64_t>(lengths.size()));
  }
  w.idx = std::string("MMIDIDX\0\0", 9);
  Append<uint64_t>(&w.idx, 1);
  Append<uint8_t>(&w.idx, int32_tokens ? 4 : 8);
  Append<uint64_t>(&w.idx, lengths.size());
  Append<uint64_t>(&w.idx, doc_index.size());
  for (int32_t l : lengths) Append(&w.idx, l);
  for (int64_t p : pointers) Append(&w.idx, p);
  for (int64_t d : doc_index) Append(&w.idx, d);
  if (modes) w.idx.append(lengths.size(), '\0');
  return w;
}

class IndexedSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ferry_indexed_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string Prefix() const { return dir_ + "/corpus_text_document"; }
  void Write(const Written& w) {
    std::ofstream(Prefix() + ".bin", std::ios::binary).write(w.bin.data(), w.bin.size());
    std::ofstream(Prefix() + ".idx", std::ios::binary).write(w.idx.data(), w.idx.size());
  }
  ferry::v1::IndexedDataset Spec(uint32_t seq_len, bool extras = true) const {
    ferry::v1::IndexedDataset spec;
    spec.set_path_prefix(Prefix());
    spec.set_seq_len(seq_len);
    spec.set_position_ids(extras);
    spec.set_cu_seqlens(extras);
    return spec;
  }
  // What a GPU job asks of its sources.
  static SourceOptions Gpu() {
    SourceOptions options;
    options.device_widens_tokens = true;
    options.row_stores = RowStores::kStreaming;
    return options;
  }
  absl::Status CreateError(const ferry::v1::IndexedDataset& spec) {
    return IndexedSource::Create(spec).status();
  }

  std::string dir_;
};

// Documents 1..4 of lengths 5, 3, 7 (two sequences: 4 + 3) and 6; tokens count up from 100.
std::vector<std::vector<std::vector<uint16_t>>> FourDocuments() {
  uint16_t next = 100;
  auto seq = [&](int n) {
    std::vector<uint16_t> s;
    for (int i = 0; i < n; ++i) s.push_back(next++);
    return s;
  };
  std::vector<std::vector<std::vector<uint16_t>>> docs;
  docs.push_back({seq(5)});
  docs.push_back({seq(3)});
  docs.push_back({seq(4), seq(3)});
  docs.push_back({seq(6)});
  return docs;
}

TEST_F(IndexedSourceTest, PacksDocumentsAndReportsTheirBoundaries) {
  Write(MakeIndexed(FourDocuments()));
  auto source = IndexedSource::Create(Spec(4));
  ASSERT_TRUE(source.ok()) << source.status();
  const std::vector<int64_t> doc_starts = {0, 5, 8, 15};  // in the stream of 21 tokens
  ASSERT_EQ((*source)->size(), (21 - 1) / 4);
  std::vector<std::string> names;
  for (const FieldLayout& f : (*source)->fields()) names.push_back(f.name);
  EXPECT_THAT(names,
              ElementsAreArray({"tokens", "position_ids", "cu_seqlens", "num_seqs", "index"}));
  auto scratch = (*source)->NewScratch();
  for (int64_t i = 0; i < (*source)->size(); ++i) {
    std::vector<int64_t> tokens(5), positions(5), index(1);
    std::vector<int32_t> cu(5), count(1);
    std::vector<uint8_t*> rows = {
        reinterpret_cast<uint8_t*>(tokens.data()), reinterpret_cast<uint8_t*>(positions.data()),
        reinterpret_cast<uint8_t*>(cu.data()), reinterpret_cast<uint8_t*>(count.data()),
        reinterpret_cast<uint8_t*>(index.data())};
    absl::Status s = (*source)->Fill(i, 0, absl::MakeSpan(rows), scratch.get());
    ASSERT_TRUE(s.ok()) << s;
    // Reference: tokens count up; a position restarts at each document start in the window.
    std::vector<int64_t> want_tokens, want_positions;
    std::vector<int32_t> want_cu = {0};
    int64_t segment_start = 0;
    for (int64_t p = 0; p < 5; ++p) {
      const int64_t t = i * 4 + p;
      want_tokens.push_back(100 + t);
      if (p > 0 && std::count(doc_starts.begin(), doc_starts.end(), t) > 0) {
        segment_start = p;
        if (p < 4) want_cu.push_back(static_cast<int32_t>(p));
      }
      want_positions.push_back(p - segment_start);
    }
    const int32_t segments = static_cast<int32_t>(want_cu.size());
    while (want_cu.size() < 5) want_cu.push_back(4);
    EXPECT_THAT(tokens, ElementsAreArray(want_tokens)) << "sample " << i;
    EXPECT_THAT(positions, ElementsAreArray(want_positions)) << "sample " << i;
    EXPECT_THAT(cu, ElementsAreArray(want_cu)) << "sample " << i;
    EXPECT_EQ(count[0], segments) << "sample " << i;
    EXPECT_EQ(index[0], i);
  }
}

// Read in ranges (a large remote .bin's blocks), the segments a sample's Fill reads make up
// the one range RangesOf gives, which the read-ahead fetches before the workers read it.
TEST_F(IndexedSourceTest, RangesOfCoverWhatFillReadsOfTheBin) {
  Write(MakeIndexed(FourDocuments()));
  RangesRecordingFs ranged(/*unit=*/8);
  auto source = IndexedSource::Create(Spec(4, /*extras=*/false), ranged);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE((*source)->ReadsInRanges());
  ranged.TakeHeld();
  auto scratch = (*source)->NewScratch();
  for (int64_t i = 0; i < (*source)->size(); ++i) {
    std::vector<std::vector<uint8_t>> buffers;
    std::vector<uint8_t*> rows;
    for (const FieldLayout& f : (*source)->fields()) {
      buffers.emplace_back(f.row_bytes);
      rows.push_back(buffers.back().data());
    }
    ASSERT_TRUE((*source)->Fill(i, 0, absl::MakeSpan(rows), scratch.get()).ok());
    std::vector<MappedRange> ranges;
    (*source)->RangesOf(i, &ranges);
    ASSERT_EQ(ranges.size(), 1u);
    EXPECT_EQ(ranges[0].file->path(), Prefix() + ".bin");
    // The holds of the .bin, one a segment, run on from the range's start to its end.
    uint64_t at = ranges[0].offset;
    for (const RangesRecordingFs::Held& held : ranged.TakeHeld()) {
      EXPECT_EQ(held.path, Prefix() + ".bin");
      EXPECT_EQ(held.offset, at) << "sample " << i;
      at = held.offset + held.length;
    }
    EXPECT_EQ(at, ranges[0].offset + ranges[0].length) << "sample " << i;
  }
}

TEST_F(IndexedSourceTest, Int32OutputWithoutExtrasAndSequenceModes) {
  Write(MakeIndexed(FourDocuments(), /*modes=*/true));
  ferry::v1::IndexedDataset spec = Spec(6, false);
  spec.set_output_dtype(ferry::v1::INT32);
  auto source = IndexedSource::Create(spec);
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_EQ((*source)->fields().size(), 2u);
  std::vector<int32_t> tokens(7);
  int64_t index = -1;
  std::vector<uint8_t*> rows = {reinterpret_cast<uint8_t*>(tokens.data()),
                                reinterpret_cast<uint8_t*>(&index)};
  ASSERT_TRUE((*source)->Fill(2, 0, absl::MakeSpan(rows), (*source)->NewScratch().get()).ok());
  EXPECT_THAT(tokens, ElementsAreArray({112, 113, 114, 115, 116, 117, 118}));
}

TEST_F(IndexedSourceTest, ForADeviceThatWidensTokensAreTheFilesOwn) {
  for (bool int32_tokens : {false, true}) {
    SCOPED_TRACE(int32_tokens ? "int32" : "uint16");
    auto docs = FourDocuments();
    Write(MakeIndexed(docs, false, int32_tokens));
    auto source = IndexedSource::Create(Spec(4), *UnconfinedDatasetFs(), Gpu());
    ASSERT_TRUE(source.ok()) << source.status();
    const FieldLayout& tokens_field = (*source)->fields()[0];
    EXPECT_EQ(tokens_field.dtype, int32_tokens ? ferry::v1::INT32 : ferry::v1::UINT16);
    EXPECT_EQ(tokens_field.device_dtype, ferry::v1::INT64);
    EXPECT_EQ(tokens_field.row_bytes, int32_tokens ? 20u : 10u);
    // position_ids are computed, so never raw.
    EXPECT_EQ((*source)->fields()[1].dtype, ferry::v1::INT64);
    EXPECT_EQ((*source)->fields()[1].device_dtype, ferry::v1::DTYPE_UNSPECIFIED);
    std::vector<uint8_t> tokens(tokens_field.row_bytes);
    std::vector<int64_t> positions(5), index(1);
    std::vector<int32_t> cu(5), count(1);
    std::vector<uint8_t*> rows = {tokens.data(), reinterpret_cast<uint8_t*>(positions.data()),
                                  reinterpret_cast<uint8_t*>(cu.data()),
                                  reinterpret_cast<uint8_t*>(count.data()),
                                  reinterpret_cast<uint8_t*>(index.data())};
    ASSERT_TRUE((*source)->Fill(2, 0, absl::MakeSpan(rows), (*source)->NewScratch().get()).ok());
    for (int p = 0; p < 5; ++p) {
      int64_t t = 0;
      if (int32_tokens) {
        int32_t v;
        std::memcpy(&v, tokens.data() + 4 * p, 4);
        t = v;
      } else {
        uint16_t v;
        std::memcpy(&v, tokens.data() + 2 * p, 2);
        t = v;
      }
      EXPECT_EQ(t, 108 + p);
    }
    EXPECT_THAT(positions, ElementsAreArray({0, 1, 2, 3, 4}));  // document 3 starts at 8
    // A negative int32 id is still refused on the raw path.
    if (int32_tokens) {
      docs[0][0][1] = 0xffff;
      Write(MakeIndexed(docs, false, true));
      auto bad = IndexedSource::Create(Spec(4), *UnconfinedDatasetFs(), Gpu());
      ASSERT_TRUE(bad.ok());
      absl::Status s = (*bad)->Fill(0, 0, absl::MakeSpan(rows), (*bad)->NewScratch().get());
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
      EXPECT_THAT(s.message(), HasSubstr("is negative"));
    }
  }
  // int32 ids delivered as INT32 need no widening: plain rows.
  Write(MakeIndexed(FourDocuments(), false, true));
  ferry::v1::IndexedDataset spec = Spec(4, false);
  spec.set_output_dtype(ferry::v1::INT32);
  auto plain = IndexedSource::Create(spec, *UnconfinedDatasetFs(), Gpu());
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->fields()[0].device_dtype, ferry::v1::DTYPE_UNSPECIFIED);
}

TEST_F(IndexedSourceTest, BadIndexHeadersSayWhatIsWrong) {
  const Written good = MakeIndexed(FourDocuments());
  struct Case {
    std::string name;
    std::function<void(Written*)> damage;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"magic", [](Written* w) { w->idx[0] = 'X'; }, "does not start with the magic"},
      {"version", [](Written* w) { w->idx[9] = 2; }, "has version 2; only version 1"},
      {"dtype", [](Written* w) { w->idx[17] = 7; }, "token dtype code 7 (float32)"},
      {"short header", [](Written* w) { w->idx.resize(20); }, "shorter than the 34-byte"},
      {"truncated", [](Written* w) { w->idx.pop_back(); }, "the index is truncated or corrupt"},
      {"huge count", [](Written* w) { std::memset(&w->idx[18], 0xff, 8); }, "need more"},
      {"doc index", [](Written* w) { w->idx[w->idx.size() - 8] = 9; },
       "document indices must run from 0 to its sequence count 5"},
      {"first pointer", [](Written* w) { w->idx[34 + 5 * 4] = 2; }, "must start at byte 0"},
      {"bin truncated", [](Written* w) { w->bin.resize(w->bin.size() - 2); },
       "' is 40 bytes, but its index"},
  };
  for (const Case& c : cases) {
    Written w = good;
    c.damage(&w);
    Write(w);
    absl::Status s = CreateError(Spec(4));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.name;
    EXPECT_THAT(s.message(), HasSubstr(Prefix())) << c.name;
  }
  fs::remove(Prefix() + ".idx");
  EXPECT_EQ(CreateError(Spec(4)).code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(CreateError(Spec(0)).message(), HasSubstr("dataset.indexed.seq_len"));
}

TEST_F(IndexedSourceTest, CorruptPointerFailsTheSampleNotTheProcess) {
  Written w = MakeIndexed(FourDocuments());
  // Sequence 2's pointer (byte 16) moved far past the .bin: contiguity no longer holds.
  const int64_t bad = int64_t{1} << 40;
  std::memcpy(&w.idx[34 + 5 * 4 + 2 * 8], &bad, 8);
  Write(w);
  auto source = IndexedSource::Create(Spec(4));
  ASSERT_TRUE(source.ok()) << source.status();  // only O(1) entries are checked up front
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<uint8_t*> rows;
  for (const FieldLayout& f : (*source)->fields()) buffers.emplace_back(f.row_bytes);
  for (auto& b : buffers) rows.push_back(b.data());
  int failed = 0;
  auto scratch = (*source)->NewScratch();
  for (int64_t i = 0; i < (*source)->size(); ++i) {
    absl::Status s = (*source)->Fill(i, 0, absl::MakeSpan(rows), scratch.get());
    if (s.ok()) continue;
    ++failed;
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(s.message(), HasSubstr("Megatron index '" + Prefix() + ".idx' is corrupt"));
  }
  EXPECT_GT(failed, 0);
}

// Malformed indexes must never read outside the mappings (run under ASan/UBSan in CI): every
// byte of the .idx set to a few values, then every sample read; each open or read either
// succeeds or returns an error.
TEST_F(IndexedSourceTest, EveryDamagedIndexByteIsRefusedOrReadSafely) {
  const Written good = MakeIndexed(FourDocuments());
  int refused = 0, failed_samples = 0;
  for (size_t at = 0; at < good.idx.size(); ++at) {
    for (uint8_t value : {uint8_t{0x00}, uint8_t{0x01}, uint8_t{0x7f}, uint8_t{0xff}}) {
      Written w = good;
      w.idx[at] = static_cast<char>(value);
      Write(w);
      auto source = IndexedSource::Create(Spec(4));
      if (!source.ok()) {
        ++refused;
        continue;
      }
      std::vector<std::vector<uint8_t>> buffers;
      std::vector<uint8_t*> rows;
      for (const FieldLayout& f : (*source)->fields()) buffers.emplace_back(f.row_bytes);
      for (auto& b : buffers) rows.push_back(b.data());
      auto scratch = (*source)->NewScratch();
      for (int64_t i = 0; i < (*source)->size(); ++i) {
        absl::Status s = (*source)->Fill(i, 0, absl::MakeSpan(rows), scratch.get());
        if (!s.ok()) {
          ++failed_samples;
          EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
        }
      }
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(failed_samples, 0);
}

TEST_F(IndexedSourceTest, DatasetPathsNameBothFiles) {
  ferry::v1::DatasetSpec dataset;
  dataset.mutable_indexed()->set_path_prefix("/d/x");
  auto paths = DatasetPaths(dataset);
  ASSERT_TRUE(paths.ok()) << paths.status();
  EXPECT_THAT(*paths, ElementsAreArray({"/d/x.bin", "/d/x.idx"}));
}

}  // namespace
}  // namespace ferry
