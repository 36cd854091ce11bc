#include "server/dataset/token_shards_source.h"

#include <errno.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/dataset/fault_injecting_fs.h"
#include "server/dataset/sample_source.h"
#include "server/sampler/sampler.h"
#include "testing/recording_fs.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using Faults = FaultInjectingFs::Faults;

class TokenShardsSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ferry_shards_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    absl::StatusOr<std::shared_ptr<const DatasetFs>> real = MakeDatasetFs(DatasetAccess());
    ASSERT_TRUE(real.ok()) << real.status();
    fs_ = std::make_shared<FaultInjectingFs>(*real);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  template <typename T>
  void WriteShard(const std::string& name, const std::vector<T>& tokens) {
    std::ofstream out(Path(name), std::ios::binary);
    out.write(reinterpret_cast<const char*>(tokens.data()),
              static_cast<std::streamsize>(tokens.size() * sizeof(T)));
  }
  // Shards of the given lengths named s-0.bin, s-1.bin, ...; token values count up across
  // shards from 1, so every window says where it came from. Returns their concatenation.
  std::vector<int64_t> WriteCountingShards(const std::vector<int>& lengths) {
    std::vector<int64_t> all;
    for (size_t s = 0; s < lengths.size(); ++s) {
      std::vector<uint16_t> tokens;
      for (int i = 0; i < lengths[s]; ++i) {
        tokens.push_back(static_cast<uint16_t>(all.size() + 1));
        all.push_back(static_cast<int64_t>(all.size() + 1));
      }
      WriteShard(absl::StrCat("s-", s, ".bin"), tokens);
    }
    return all;
  }
  ferry::v1::TokenShardsDataset Spec(const std::string& pattern, uint32_t seq_len) const {
    ferry::v1::TokenShardsDataset spec;
    spec.add_shards(Path(pattern));
    spec.set_token_dtype(ferry::v1::UINT16);
    spec.set_seq_len(seq_len);
    return spec;
  }
  // Sample `index`'s tokens as int64 (the source's output dtype must be INT64).
  std::vector<int64_t> Tokens(const SampleSource& source, int64_t index) {
    std::vector<int64_t> tokens(source.fields()[0].shape[0]);
    int64_t got = -1;
    std::vector<uint8_t*> rows = {reinterpret_cast<uint8_t*>(tokens.data()),
                                  reinterpret_cast<uint8_t*>(&got)};
    auto scratch = source.NewScratch();
    absl::Status s = source.Fill(index, 0, absl::MakeSpan(rows), scratch.get());
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(got, index);
    return tokens;
  }

  std::string dir_;
  std::shared_ptr<FaultInjectingFs> fs_;
};

TEST_F(TokenShardsSourceTest, WindowsStayWithinTheirShard) {
  const std::vector<int> lengths = {7, 10, 3, 12, 4};
  const std::vector<int64_t> all = WriteCountingShards(lengths);
  auto source = TokenShardsSource::Create(Spec("s-{0..4}.bin", 3), false, *fs_);
  ASSERT_TRUE(source.ok()) << source.status();
  // Reference: per shard, windows at 0, 3, 6, ... while seq_len + 1 = 4 tokens fit.
  std::vector<std::vector<int64_t>> expected;
  int64_t first = 0;
  for (int n : lengths) {
    for (int start = 0; start + 4 <= n; start += 3) {
      expected.emplace_back(all.begin() + first + start, all.begin() + first + start + 4);
    }
    first += n;
  }
  ASSERT_EQ((*source)->size(), 9);  // 2 + 3 + 0 + 3 + 1
  ASSERT_EQ((*source)->size(), static_cast<int64_t>(expected.size()));
  EXPECT_EQ((*source)->num_shards(), 5u);
  for (int64_t i = 0; i < (*source)->size(); ++i) {
    EXPECT_THAT(Tokens(**source, i), ElementsAreArray(expected[i])) << "sample " << i;
  }
  EXPECT_EQ((*source)->Describe(2), Path("s-1.bin") + " tokens [0, 4)");
  EXPECT_EQ((*source)->Locate(5).shard, 3u);  // shard 2 holds no window
}

TEST_F(TokenShardsSourceTest, WindowsCrossFilesWhenAsked) {
  const std::vector<int64_t> all = WriteCountingShards({7, 0, 10, 3, 12});
  ferry::v1::TokenShardsDataset spec = Spec("s-{0..4}.bin", 3);
  spec.set_windows_cross_files(true);
  auto source = TokenShardsSource::Create(spec, false, *fs_);
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_EQ((*source)->size(), (32 - 1) / 3);
  for (int64_t i = 0; i < (*source)->size(); ++i) {
    std::vector<int64_t> want(all.begin() + i * 3, all.begin() + i * 3 + 4);
    EXPECT_THAT(Tokens(**source, i), ElementsAreArray(want)) << "sample " << i;
  }
  // Sample 2 = tokens [6, 10): the last of s-0, then s-2's first three (s-1 is empty).
  EXPECT_EQ((*source)->Describe(2),
            Path("s-0.bin") + " tokens [6, 7) and the next shards' first 3");
}

// Read in ranges (a large remote object's blocks), every sample's Fill reads exactly the
// ranges RangesOf gives, which the read-ahead fetches before the workers get to them.
TEST_F(TokenShardsSourceTest, RangesOfAreTheRangesFillReads) {
  WriteCountingShards({7, 0, 10, 3, 12});
  for (const bool cross : {false, true}) {
    ferry::v1::TokenShardsDataset spec = Spec("s-{0..4}.bin", 3);
    spec.set_windows_cross_files(cross);
    RangesRecordingFs ranged(/*unit=*/8);
    auto source = TokenShardsSource::Create(spec, false, ranged);
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_TRUE((*source)->ReadsInRanges());
    ranged.TakeHeld();  // the check that the shards hold tokens
    for (int64_t i = 0; i < (*source)->size(); ++i) {
      std::vector<MappedRange> ranges;
      (*source)->RangesOf(i, &ranges);
      std::vector<RangesRecordingFs::Held> want;
      for (const MappedRange& r : ranges) want.push_back({r.file->path(), r.offset, r.length});
      Tokens(**source, i);
      EXPECT_EQ(ranged.TakeHeld(), want) << "sample " << i << (cross ? ", crossing" : "");
      EXPECT_FALSE(want.empty());
    }
    std::vector<MappedRange> none;
    (*source)->RangesOf((*source)->size(), &none);
    EXPECT_TRUE(none.empty());
  }
  // Mapped whole: nothing to fetch.
  auto whole = TokenShardsSource::Create(Spec("s-{0..4}.bin", 3), false, *fs_);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_FALSE((*whole)->ReadsInRanges());
  std::vector<MappedRange> ranges;
  (*whole)->RangesOf(0, &ranges);
  EXPECT_TRUE(ranges.empty());
}

TEST_F(TokenShardsSourceTest, Int32OutputAndOverflowNamesTheShard) {
  WriteShard<uint32_t>("a.bin", {1, 2, 3, 4, 5});
  WriteShard<uint32_t>("b.bin", {6, 7, 0x80000000u, 9, 10});
  ferry::v1::TokenShardsDataset spec = Spec("{a,b}.bin", 2);
  spec.set_token_dtype(ferry::v1::UINT32);
  spec.set_output_dtype(ferry::v1::INT32);
  auto source = TokenShardsSource::Create(spec, false, *fs_);
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_EQ((*source)->size(), 4);
  std::vector<int32_t> tokens(3);
  int64_t index = -1;
  std::vector<uint8_t*> rows = {reinterpret_cast<uint8_t*>(tokens.data()),
                                reinterpret_cast<uint8_t*>(&index)};
  ASSERT_TRUE((*source)->Fill(1, 0, absl::MakeSpan(rows), nullptr).ok());
  EXPECT_THAT(tokens, ElementsAreArray({3, 4, 5}));
  absl::Status s = (*source)->Fill(2, 0, absl::MakeSpan(rows), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("token 2 of '" + Path("b.bin") + "' (value 2147483648)"));
  // Raw: the bytes as stored (a device widens them); UINT32 -> INT32 is refused.
  EXPECT_EQ(TokenShardsSource::Create(spec, true, *fs_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(TokenShardsSourceTest, RawRowsKeepTheFileDtype) {
  WriteCountingShards({5, 5});
  auto source = TokenShardsSource::Create(Spec("s-{0..1}.bin", 4), true, *fs_);
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_EQ((*source)->fields()[0].dtype, ferry::v1::UINT16);
  ASSERT_EQ((*source)->fields()[0].row_bytes, 10u);
  std::vector<uint16_t> tokens(5);
  int64_t index = -1;
  std::vector<uint8_t*> rows = {reinterpret_cast<uint8_t*>(tokens.data()),
                                reinterpret_cast<uint8_t*>(&index)};
  ASSERT_TRUE((*source)->Fill(1, 0, absl::MakeSpan(rows), nullptr).ok());
  EXPECT_THAT(tokens, ElementsAreArray({6, 7, 8, 9, 10}));
  EXPECT_EQ(index, 1);
}

TEST_F(TokenShardsSourceTest, BadSpecsAndShardsSayWhatIsWrong) {
  WriteCountingShards({9, 2});
  ferry::v1::TokenShardsDataset spec = Spec("s-{0..1}.bin", 4);
  spec.clear_shards();
  EXPECT_THAT(TokenShardsSource::Create(spec, false, *fs_).status().message(),
              HasSubstr("dataset.token_shards.shards must list at least one"));
  spec = Spec("s-{0..1}.bin", 0);
  EXPECT_THAT(TokenShardsSource::Create(spec, false, *fs_).status().message(),
              HasSubstr("dataset.token_shards.seq_len must be at least 1"));
  spec = Spec("s-{0..1}.bin", 4);
  spec.set_token_dtype(ferry::v1::INT64);
  EXPECT_THAT(TokenShardsSource::Create(spec, false, *fs_).status().message(),
              HasSubstr("token_dtype must be UINT16 or UINT32 (got INT64)"));
  spec = Spec("s-{1..0}.bin", 4);
  EXPECT_EQ(TokenShardsSource::Create(spec, false, *fs_).status().code(),
            absl::StatusCode::kInvalidArgument);
  // More shards than a job may map: refused before the names are made (a million of them
  // took 332 MB), naming the bound; one pattern or several together.
  spec = Spec("s-{0..999999}.bin", 4);
  auto many = TokenShardsSource::Create(spec, false, *fs_);
  EXPECT_EQ(many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(many.status().message(), HasSubstr("expands to more than 16384 names"));
  spec = Spec("s-{0..9999}.bin", 4);
  spec.add_shards("t-{0..9999}.bin");
  EXPECT_THAT(TokenShardsSource::Create(spec, false, *fs_).status().message(),
              HasSubstr("shard pattern 't-{0..9999}.bin': the shard list expands to more than "
                        "16384 names"));
  // A missing shard is named.
  auto missing = TokenShardsSource::Create(Spec("s-{0..2}.bin", 4), false, *fs_);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr(Path("s-2.bin")));
  // A shard of an odd byte size (cut short) is named.
  std::ofstream(Path("s-1.bin"), std::ios::binary | std::ios::app).write("x", 1);
  auto odd = TokenShardsSource::Create(Spec("s-{0..1}.bin", 4), false, *fs_);
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument) << odd.status();
  EXPECT_THAT(odd.status().message(),
              HasSubstr("token shard '" + Path("s-1.bin") + "' is 5 bytes, not a multiple of 2"));
  // No shard holds a window: says so and what to do.
  auto none = TokenShardsSource::Create(Spec("s-0.bin", 9), false, *fs_);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition) << none.status();
  EXPECT_THAT(none.status().message(), HasSubstr("or set windows_cross_files"));
}

TEST_F(TokenShardsSourceTest, FaultsOfTheFilesystemNameTheShard) {
  WriteCountingShards({9, 9});
  fs_->Inject("/s-1.bin", Faults{.open_errno = EIO});
  auto failed = TokenShardsSource::Create(Spec("s-{0..1}.bin", 4), false, *fs_);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_THAT(failed.status().message(), HasSubstr("cannot open '" + Path("s-1.bin") + "'"));
  // A mapping shorter than the file (it shrank): measured, never read past.
  fs_->Inject("/s-1.bin", Faults{.mapped_bytes = 10});
  auto shrunk = TokenShardsSource::Create(Spec("s-{0..1}.bin", 4), false, *fs_);
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  EXPECT_EQ((*shrunk)->size(), 2 + 1);
  EXPECT_THAT(Tokens(**shrunk, 2), ElementsAreArray({10, 11, 12, 13, 14}));
}

TEST_F(TokenShardsSourceTest, MakeSampleSourceAndDatasetPathsExpandThePatterns) {
  WriteCountingShards({9, 9, 9});
  ferry::v1::JobSpec job;
  *job.mutable_dataset()->mutable_token_shards() = Spec("s-{0..2}.bin", 4);
  absl::StatusOr<std::vector<std::string>> paths = DatasetPaths(job.dataset());
  ASSERT_TRUE(paths.ok()) << paths.status();
  EXPECT_THAT(*paths, ElementsAreArray({Path("s-0.bin"), Path("s-1.bin"), Path("s-2.bin")}));
  auto source = MakeSampleSource(job, fs_);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->size(), 6);
  EXPECT_EQ((*source)->fields()[0].dtype, ferry::v1::INT64);
  EXPECT_EQ((*source)->fields()[0].device_dtype, ferry::v1::DTYPE_UNSPECIFIED);
  // A GPU job gets the raw dtype, marked for the device to widen to the output dtype.
  SourceOptions gpu;
  gpu.device_widens_tokens = true;
  EXPECT_EQ((*MakeSampleSource(job, fs_, gpu))->fields()[0].dtype, ferry::v1::UINT16);
  EXPECT_EQ((*MakeSampleSource(job, fs_, gpu))->fields()[0].device_dtype, ferry::v1::INT64);
  job.mutable_dataset()->mutable_token_shards()->set_output_dtype(ferry::v1::INT32);
  EXPECT_EQ((*MakeSampleSource(job, fs_, gpu))->fields()[0].dtype, ferry::v1::UINT16);
  EXPECT_EQ((*MakeSampleSource(job, fs_, gpu))->fields()[0].device_dtype, ferry::v1::INT32);
  job.mutable_dataset()->mutable_token_shards()->set_output_dtype(ferry::v1::INT64);
  job.mutable_dataset()->mutable_token_shards()->set_widen_on_host(true);
  EXPECT_EQ((*MakeSampleSource(job, fs_, gpu))->fields()[0].dtype, ferry::v1::INT64);
}

TEST_F(TokenShardsSourceTest, EveryRankGetsTheSameCountForOneToEightRanks) {
  WriteCountingShards({23, 5, 41, 17});
  auto source = TokenShardsSource::Create(Spec("s-{0..3}.bin", 4), false, *fs_);
  ASSERT_TRUE(source.ok()) << source.status();
  const int64_t n = (*source)->size();
  ASSERT_EQ(n, 5 + 1 + 10 + 4);
  for (bool drop_last : {false, true}) {
    for (int64_t world = 1; world <= 8; ++world) {
      auto sampler = Sampler::Create({.num_samples = n,
                                      .batch_size = 2,
                                      .world_size = world,
                                      .shuffle = true,
                                      .drop_last = drop_last,
                                      .seed = 7});
      ASSERT_TRUE(sampler.ok()) << sampler.status();
      std::set<int64_t> seen;
      int64_t total = 0;
      for (int64_t rank = 0; rank < world; ++rank) {
        int64_t count = 0;
        for (int64_t b = 0; b < (*sampler)->batches_per_epoch(); ++b) {
          std::vector<int64_t> ids;
          (*sampler)->BatchIndices(0, rank, b, &ids);
          for (int64_t id : ids) {
            ASSERT_GE(id, 0);
            ASSERT_LT(id, n);
            Tokens(**source, id);  // every index the sampler deals is readable
            seen.insert(id);
          }
          count += static_cast<int64_t>(ids.size());
        }
        // With drop_last a short last batch is dropped: whole batches only.
        const int64_t want =
            drop_last ? (*sampler)->batches_per_epoch() * 2 : (*sampler)->samples_per_rank();
        EXPECT_EQ(count, want) << "world " << world << " rank " << rank;
        total += count;
      }
      EXPECT_GT(total, 0);
      if (!drop_last) {
        EXPECT_EQ(static_cast<int64_t>(seen.size()), n) << "world " << world;
      }
    }
  }
}

}  // namespace
}  // namespace ferry
