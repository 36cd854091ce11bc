// A dataset file truncated by its owner while a job reads it: the readers that map files
// (tokens, token shards, records, a Megatron .bin and .idx) return DatasetChangedError
// naming the file, instead of
// the SIGBUS that would end ferryd for every user; the parts still there read as before.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/dataset/dataset_fs.h"
#include "server/dataset/sample_source.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

class TruncatedFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/ferry-truncated-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    unlink(path_.c_str());
    unlink((dir_ + "/mega.idx").c_str());
    unlink((dir_ + "/mega.bin").c_str());
    rmdir(dir_.c_str());
  }

  // A file of `tokens` little-endian uint16 ids 0, 1, 2, ... (mod 60000).
  void WriteTokens(size_t tokens) {
    path_ = dir_ + "/data.bin";
    std::vector<uint16_t> ids(tokens);
    for (size_t i = 0; i < tokens; ++i) ids[i] = static_cast<uint16_t>(i % 60000);
    std::ofstream(path_, std::ios::binary)
        .write(reinterpret_cast<const char*>(ids.data()),
               static_cast<std::streamsize>(ids.size() * 2));
  }

  // Fills sample `index` of `source` into fresh rows.
  absl::Status FillOne(const SampleSource& source, int64_t index) {
    std::vector<std::vector<uint8_t>> storage;
    std::vector<uint8_t*> rows;
    for (const FieldLayout& field : source.fields()) {
      storage.emplace_back(field.row_bytes);
      rows.push_back(storage.back().data());
    }
    auto scratch = source.NewScratch();
    return source.Fill(index, 0, rows, scratch.get());
  }

  std::string dir_;
  std::string path_;
};

TEST_F(TruncatedFileTest, TokensPastTheNewEndAreDatasetChanged) {
  WriteTokens(64 * 1024);  // 128 KiB: 32 pages
  ferry::v1::JobSpec spec;
  spec.set_batch_size(1);
  auto* tokens = spec.mutable_dataset()->mutable_tokens();
  tokens->set_path(path_);
  tokens->set_token_dtype(ferry::v1::UINT16);
  tokens->set_seq_len(1023);
  auto source = MakeSampleSource(spec, UnconfinedDatasetFs());
  ASSERT_TRUE(source.ok()) << source.status();
  const int64_t last = (*source)->size() - 1;
  ASSERT_TRUE(FillOne(**source, last).ok());
  ASSERT_EQ(truncate(path_.c_str(), 4096), 0);  // the owner cuts it to one page
  EXPECT_TRUE(FillOne(**source, 0).ok());       // within the page still there
  const absl::Status cut = FillOne(**source, last);
  EXPECT_TRUE(IsDatasetChanged(cut)) << cut;
  EXPECT_EQ(cut.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(cut.message(), HasSubstr(path_));
  EXPECT_THAT(cut.message(), HasSubstr("shrank while the job read it (131072 bytes when the job "
                                       "opened it; it is now 4096 bytes)"));
  EXPECT_THAT(cut.message(), HasSubstr("create the job again"));
  EXPECT_FALSE(IsDatasetChanged(absl::DataLossError("a corrupt sample")));
}

TEST_F(TruncatedFileTest, RecordsAndTokenShardsToo) {
  WriteTokens(64 * 1024);
  ferry::v1::JobSpec records;
  records.set_batch_size(1);
  records.mutable_dataset()->mutable_records()->set_path(path_);
  records.mutable_dataset()->mutable_records()->set_dtype(ferry::v1::INT64);
  records.mutable_dataset()->mutable_records()->add_shape(128);  // 1 KiB records
  ferry::v1::JobSpec shards;
  shards.set_batch_size(1);
  shards.mutable_dataset()->mutable_token_shards()->add_shards(path_);
  shards.mutable_dataset()->mutable_token_shards()->set_token_dtype(ferry::v1::UINT16);
  shards.mutable_dataset()->mutable_token_shards()->set_seq_len(511);
  auto by_records = MakeSampleSource(records, UnconfinedDatasetFs());
  auto by_shards = MakeSampleSource(shards, UnconfinedDatasetFs());
  ASSERT_TRUE(by_records.ok()) << by_records.status();
  ASSERT_TRUE(by_shards.ok()) << by_shards.status();
  ASSERT_EQ(truncate(path_.c_str(), 0), 0);
  EXPECT_TRUE(IsDatasetChanged(FillOne(**by_records, (*by_records)->size() - 1)));
  EXPECT_TRUE(IsDatasetChanged(FillOne(**by_shards, (*by_shards)->size() - 1)));
}

// A GPU rank gathers records from the registered mapping itself: the worker writes only the
// index (a null data row). The pinned pages keep the bytes the file no longer has, so the
// worker's Fill must still see the cut.
TEST_F(TruncatedFileTest, RecordsTheDeviceGathersToo) {
  WriteTokens(64 * 1024);
  ferry::v1::JobSpec spec;
  spec.set_batch_size(1);
  spec.mutable_dataset()->mutable_records()->set_path(path_);
  spec.mutable_dataset()->mutable_records()->set_dtype(ferry::v1::INT64);
  spec.mutable_dataset()->mutable_records()->add_shape(128);  // 1 KiB records, 128 of them
  auto source = MakeSampleSource(spec, UnconfinedDatasetFs());
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_TRUE((*source)->direct_rows().has_value());
  int64_t index = -1;
  auto fill_index_only = [&](int64_t i) {
    uint8_t* rows[] = {nullptr, reinterpret_cast<uint8_t*>(&index)};
    auto scratch = (*source)->NewScratch();
    return (*source)->Fill(i, 0, rows, scratch.get());
  };
  ASSERT_TRUE(fill_index_only(127).ok());
  EXPECT_EQ(index, 127);
  ASSERT_EQ(truncate(path_.c_str(), 4096), 0);  // records 0-3 are left
  EXPECT_TRUE(fill_index_only(3).ok());
  const absl::Status cut = fill_index_only(4);
  EXPECT_TRUE(IsDatasetChanged(cut)) << cut;
  EXPECT_THAT(cut.message(), HasSubstr(path_));
}

// The index of a Megatron dataset is read on every Fill (the window's sequences and
// document starts): cutting it short must not end ferryd either.
TEST_F(TruncatedFileTest, AMegatronIndexCutShortIsDatasetChanged) {
  constexpr int64_t kSequences = 4096, kTokens = 16;  // an index of about 80 KiB
  std::string idx("MMIDIDX\0\0", 9);
  auto put = [&idx](auto value) {
    idx.append(reinterpret_cast<const char*>(&value), sizeof(value));
  };
  put(uint64_t{1});
  put(uint8_t{8});  // uint16 tokens
  put(uint64_t{kSequences});
  put(uint64_t{kSequences + 1});
  for (int64_t s = 0; s < kSequences; ++s) put(int32_t{kTokens});
  for (int64_t s = 0; s < kSequences; ++s) put(int64_t{s * kTokens * 2});
  for (int64_t d = 0; d <= kSequences; ++d) put(int64_t{d});
  std::ofstream(dir_ + "/mega.idx", std::ios::binary).write(idx.data(), idx.size());
  WriteTokens(kSequences * kTokens);
  ASSERT_EQ(rename(path_.c_str(), (dir_ + "/mega.bin").c_str()), 0);
  path_ = dir_ + "/mega.bin";
  ferry::v1::JobSpec spec;
  spec.set_batch_size(1);
  spec.mutable_dataset()->mutable_indexed()->set_path_prefix(dir_ + "/mega");
  spec.mutable_dataset()->mutable_indexed()->set_seq_len(kTokens - 1);
  auto source = MakeSampleSource(spec, UnconfinedDatasetFs());
  ASSERT_TRUE(source.ok()) << source.status();
  const int64_t last = (*source)->size() - 1;
  ASSERT_TRUE(FillOne(**source, last).ok());
  ASSERT_EQ(truncate((dir_ + "/mega.idx").c_str(), 4096), 0);
  const absl::Status cut = FillOne(**source, last);
  EXPECT_TRUE(IsDatasetChanged(cut)) << cut;
  EXPECT_THAT(cut.message(), HasSubstr(dir_ + "/mega.idx"));
}

}  // namespace
}  // namespace ferry
