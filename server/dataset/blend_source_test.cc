#include "server/dataset/blend_source.h"

#include <stdlib.h>

#include <cmath>
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
#include "server/dataset/sample_source.h"
#include "server/sampler/sampler.h"
#include "testing/recording_fs.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr uint32_t kSeqLen = 4;

class BlendSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ferry_blend_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    absl::StatusOr<std::shared_ptr<const DatasetFs>> real = MakeDatasetFs(DatasetAccess());
    ASSERT_TRUE(real.ok()) << real.status();
    fs_ = *real;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // A token file of `windows` windows of kSeqLen + 1 whose tokens are base + i, so a row's
  // first token says which source and window it came from.
  std::string WriteTokens(const std::string& name, int windows, uint16_t base) {
    const std::string path = dir_ + "/" + name;
    std::vector<uint16_t> tokens;
    for (int i = 0; i < windows * static_cast<int>(kSeqLen) + 1; ++i) {
      tokens.push_back(static_cast<uint16_t>(base + i));
    }
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(tokens.data()),
              static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
    return path;
  }

  // A blend of token files with the given windows and weights.
  ferry::v1::JobSpec BlendSpec(const std::vector<int>& windows, const std::vector<double>& weights,
                               uint64_t samples_per_epoch = 0) {
    ferry::v1::JobSpec spec;
    ferry::v1::BlendDataset* blend = spec.mutable_dataset()->mutable_blend();
    for (size_t s = 0; s < windows.size(); ++s) {
      ferry::v1::BlendSource* source = blend->add_sources();
      ferry::v1::TokensDataset* t = source->mutable_dataset()->mutable_tokens();
      t->set_path(
          WriteTokens(absl::StrCat("s", s, ".bin"), windows[s], static_cast<uint16_t>(10000 * s)));
      t->set_token_dtype(ferry::v1::UINT16);
      t->set_seq_len(kSeqLen);
      source->set_weight(weights[s]);
    }
    blend->set_samples_per_epoch(samples_per_epoch);
    return spec;
  }

  std::unique_ptr<BlendSource> Open(const ferry::v1::JobSpec& spec) {
    absl::StatusOr<std::unique_ptr<BlendSource>> blend =
        BlendSource::Create(spec, fs_, SourceOptions());
    EXPECT_TRUE(blend.ok()) << blend.status();
    return blend.ok() ? *std::move(blend) : nullptr;
  }

  absl::Status OpenError(const ferry::v1::JobSpec& spec) {
    return BlendSource::Create(spec, fs_, SourceOptions()).status();
  }

  std::string dir_;
  std::shared_ptr<const DatasetFs> fs_;
};

TEST_F(BlendSourceTest, ItsTableOfPositionsCountsAgainstTheHostBudget) {
  MemoryBudget budget("host memory budget", "host_memory_budget_bytes", 1 << 20,
                      "/etc/ferry/ferryd.conf");
  SourceOptions options;
  options.host_budget = &budget;
  {
    auto small = BlendSource::Create(BlendSpec({7, 50}, {1, 1}, 1000), fs_, options);
    ASSERT_TRUE(small.ok()) << small.status();
    EXPECT_GE(budget.in_use(), 1000u);  // a byte per position, and the checkpoints
  }
  EXPECT_EQ(budget.in_use(), 0u) << "returned with the source";
  // 2^30 positions need a GiB: refused before any is made (it took 49 s of a handler and
  // memory outside the budget).
  auto huge = BlendSource::Create(BlendSpec({7, 50}, {1, 1}, int64_t{1} << 30), fs_, options);
  ASSERT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_THAT(huge.status().message(), HasSubstr("dataset.blend.samples_per_epoch"));
  EXPECT_THAT(huge.status().message(), HasSubstr("host_memory_budget_bytes"));
  EXPECT_EQ(budget.in_use(), 0u);
}

TEST_F(BlendSourceTest, EveryPrefixFollowsTheWeightsWithinOneSample) {
  const std::vector<double> weights = {5, 3, 2};  // normalised to 0.5, 0.3, 0.2
  auto blend = Open(BlendSpec({7, 50, 11}, weights, 1000));
  ASSERT_NE(blend, nullptr);
  EXPECT_EQ(blend->size(), 68);
  EXPECT_EQ(blend->epoch_size(), 1000);
  std::vector<int64_t> count(3, 0);
  for (int64_t p = 0; p < 1000; ++p) {
    int64_t local = 0;
    ++count[blend->SourceOf(blend->IndexAt(0, 0, false, p), &local)];
    for (int s = 0; s < 3; ++s) {
      EXPECT_LE(std::abs(static_cast<double>(count[s]) - weights[s] / 10 * (p + 1)), 1.0)
          << "source " << s << " after " << p + 1 << " positions";
    }
  }
  const std::vector<SampleSource::Part> parts = blend->parts();
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].samples_per_epoch, 500);
  EXPECT_EQ(parts[1].samples_per_epoch, 300);
  EXPECT_EQ(parts[2].samples_per_epoch, 200);
  EXPECT_EQ(parts[1].name, "source1");
  EXPECT_DOUBLE_EQ(parts[2].weight, 0.2);
  EXPECT_EQ(parts[2].num_samples, 11);
}

TEST_F(BlendSourceTest, WithoutShuffleSourcesAreReadInOrderAndContinueAcrossEpochs) {
  // The default epoch is the sum of the sizes (30): source 0 (weight 0.5, 5 windows) is read
  // three times over; source 1 (25 windows) gets 15 positions an epoch, so epoch 1 goes on
  // from its window 15.
  auto blend = Open(BlendSpec({5, 25}, {1, 1}));
  ASSERT_NE(blend, nullptr);
  ASSERT_EQ(blend->epoch_size(), 30);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> next = {epoch * 15, epoch * 15};
    for (int64_t p = 0; p < 30; ++p) {
      int64_t local = 0;
      const int s = blend->SourceOf(blend->IndexAt(7, epoch, false, p), &local);
      const int64_t size = s == 0 ? 5 : 25;
      EXPECT_EQ(local, next[s]++ % size) << "epoch " << epoch << " position " << p;
    }
  }
}

TEST_F(BlendSourceTest, ShuffledPassesReadEverySampleOnceBeforeRepeating) {
  // Source 0 (13 windows, weight 0.9 of 100 positions) makes 90 draws an epoch: passes of 13.
  auto blend = Open(BlendSpec({13, 40}, {9, 1}, 100));
  ASSERT_NE(blend, nullptr);
  std::vector<int64_t> draws;  // source 0's local samples in draw order over 3 epochs
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    for (int64_t p = 0; p < 100; ++p) {
      int64_t local = 0;
      if (blend->SourceOf(blend->IndexAt(42, epoch, true, p), &local) == 0) {
        draws.push_back(local);
      }
    }
  }
  ASSERT_EQ(draws.size(), 270u);
  bool some_pass_not_identity = false;
  for (size_t pass = 0; pass + 13 <= draws.size(); pass += 13) {
    std::set<int64_t> seen(draws.begin() + pass, draws.begin() + pass + 13);
    EXPECT_EQ(seen.size(), 13u) << "pass starting at draw " << pass;
    for (size_t i = 0; i < 13; ++i) some_pass_not_identity |= draws[pass + i] != int64_t(i);
  }
  EXPECT_TRUE(some_pass_not_identity);
  // The passes differ from each other, and from another seed's.
  EXPECT_FALSE(std::equal(draws.begin(), draws.begin() + 13, draws.begin() + 13));
  int64_t local = 0, other = 0;
  int differ = 0;
  for (int64_t p = 0; p < 100; ++p) {
    blend->SourceOf(blend->IndexAt(42, 0, true, p), &local);
    blend->SourceOf(blend->IndexAt(43, 0, true, p), &other);
    differ += local != other;
  }
  EXPECT_GT(differ, 10);
}

TEST_F(BlendSourceTest, TwoOpeningsMapEveryPositionAlike) {
  const ferry::v1::JobSpec spec = BlendSpec({17, 29, 5}, {0.2, 0.7, 0.1}, 500);
  auto a = Open(spec);
  auto b = Open(spec);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    for (int64_t p = 0; p < 500; ++p) {
      ASSERT_EQ(a->IndexAt(9, epoch, true, p), b->IndexAt(9, epoch, true, p));
    }
  }
}

TEST_F(BlendSourceTest, FillReadsTheSourceOfTheIndexAndCountsIt) {
  auto blend = Open(BlendSpec({3, 4}, {1, 3}));
  ASSERT_NE(blend, nullptr);
  ASSERT_EQ(blend->fields().size(), 2u);  // tokens, index
  EXPECT_EQ(blend->fields()[0].name, "tokens");
  EXPECT_TRUE(blend->FillIsCopy());
  auto scratch = blend->NewScratch();
  std::vector<int64_t> tokens(kSeqLen + 1);
  int64_t index = -1;
  std::vector<uint8_t*> rows = {reinterpret_cast<uint8_t*>(tokens.data()),
                                reinterpret_cast<uint8_t*>(&index)};
  // Index 5 is source 1's window 2: tokens 10000 + 8 ...
  ASSERT_TRUE(blend->Fill(5, 0, rows, scratch.get()).ok());
  EXPECT_EQ(index, 5);  // the blend's index, not the source's (2)
  EXPECT_EQ(tokens[0], 10000 + 2 * kSeqLen);
  EXPECT_EQ(tokens[kSeqLen], 10000 + 3 * kSeqLen);
  ASSERT_TRUE(blend->Fill(1, 0, rows, scratch.get()).ok());
  EXPECT_EQ(tokens[0], kSeqLen);
  ASSERT_TRUE(blend->Fill(6, 0, rows, scratch.get()).ok());
  // Draws are counted where positions are mapped, not per Fill.
  EXPECT_EQ(blend->parts()[1].samples_drawn, 0);
  std::vector<int64_t> positions = {0, 1, 2, 3, 4, 5, 6};
  blend->MapPositions(0, 0, false, absl::MakeSpan(positions));
  EXPECT_EQ(blend->parts()[0].samples_drawn + blend->parts()[1].samples_drawn, 7);
  EXPECT_EQ(blend->parts()[0].samples_drawn, 2);  // weight 1/4 of the first 7 positions
  EXPECT_THAT(blend->Describe(5), HasSubstr("(blend source 'source1')"));
  EXPECT_THAT(blend->Describe(5), HasSubstr("s1.bin"));
}

// Read in ranges (large remote token files' blocks), a blend's sample reads the ranges its
// source's RangesOf gives, which the read-ahead fetches before the workers; an index outside
// the blend gives none.
TEST_F(BlendSourceTest, RangesOfAreTheRangesItsSourceReads) {
  auto ranged_fs = std::make_shared<const RangesRecordingFs>(/*unit=*/8);
  const RangesRecordingFs& ranged = *ranged_fs;
  absl::StatusOr<std::unique_ptr<BlendSource>> blend =
      BlendSource::Create(BlendSpec({3, 4}, {1, 3}), ranged_fs, SourceOptions());
  ASSERT_TRUE(blend.ok()) << blend.status();
  EXPECT_TRUE((*blend)->ReadsInRanges());
  EXPECT_EQ((*blend)->FileOf(0), "");  // mapped kinds open no file per sample
  auto scratch = (*blend)->NewScratch();
  std::vector<int64_t> tokens(kSeqLen + 1);
  int64_t index = -1;
  std::vector<uint8_t*> rows = {reinterpret_cast<uint8_t*>(tokens.data()),
                                reinterpret_cast<uint8_t*>(&index)};
  ranged.TakeHeld();
  for (int64_t i = 0; i < (*blend)->size(); ++i) {
    ASSERT_TRUE((*blend)->Fill(i, 0, rows, scratch.get()).ok());
    std::vector<MappedRange> ranges;
    (*blend)->RangesOf(i, &ranges);
    std::vector<RangesRecordingFs::Held> want;
    for (const MappedRange& r : ranges) want.push_back({r.file->path(), r.offset, r.length});
    EXPECT_EQ(ranged.TakeHeld(), want) << "sample " << i;
    ASSERT_EQ(ranges.size(), 1u);
    EXPECT_THAT(ranges[0].file->path(), HasSubstr(i < 3 ? "s0.bin" : "s1.bin"));
  }
  std::vector<MappedRange> none;
  (*blend)->RangesOf((*blend)->size(), &none);
  (*blend)->RangesOf(-1, &none);
  EXPECT_TRUE(none.empty());
}

// Sources mapped whole from local files have nothing to read ahead: no file per sample, no
// ranges.
TEST_F(BlendSourceTest, LocalMappedSourcesHaveNothingToReadAhead) {
  auto blend = Open(BlendSpec({3, 4}, {1, 3}));
  ASSERT_NE(blend, nullptr);
  EXPECT_FALSE(blend->ReadsInRanges());
  for (int64_t i = 0; i < blend->size(); ++i) {
    std::vector<MappedRange> ranges;
    blend->RangesOf(i, &ranges);
    EXPECT_TRUE(ranges.empty()) << "sample " << i;
    EXPECT_EQ(blend->FileOf(i), "") << "sample " << i;
  }
}

TEST_F(BlendSourceTest, EveryRankGetsTheSameCountAndTheEpochFollowsTheWeights) {
  auto blend = Open(BlendSpec({40, 90, 13}, {0.6, 0.3, 0.1}, 1001));
  ASSERT_NE(blend, nullptr);
  for (int world = 1; world <= 8; ++world) {
    SamplerOptions options;
    options.num_samples = blend->epoch_size();
    options.batch_size = 16;
    options.world_size = world;
    options.shuffle = true;
    options.seed = 5;
    options.map_positions = [&blend](int64_t epoch, absl::Span<int64_t> positions) {
      blend->MapPositions(5, epoch, true, positions);
    };
    auto sampler = Sampler::Create(options);
    ASSERT_TRUE(sampler.ok()) << sampler.status();
    std::vector<int64_t> count(3, 0);
    int64_t total = 0;
    std::vector<int64_t> ids;
    for (int rank = 0; rank < world; ++rank) {
      int64_t rank_samples = 0;
      for (int64_t b = 0; b < (*sampler)->batches_per_epoch(); ++b) {
        (*sampler)->BatchIndices(1, rank, b, &ids);
        rank_samples += static_cast<int64_t>(ids.size());
        for (int64_t id : ids) {
          int64_t local = 0;
          ASSERT_GE(id, 0);
          ASSERT_LT(id, blend->size());
          ++count[blend->SourceOf(id, &local)];
        }
      }
      EXPECT_EQ(rank_samples, (*sampler)->samples_per_rank()) << "world " << world;
      total += rank_samples;
    }
    // Padding repeats at most world - 1 positions; otherwise the epoch is the blend's.
    EXPECT_EQ(total, (1001 + world - 1) / world * world);
    EXPECT_NEAR(count[0], 601, world);
    EXPECT_NEAR(count[1], 300, world);
    EXPECT_NEAR(count[2], 100, world);
  }
}

TEST_F(BlendSourceTest, RefusesBadSpecsNamingTheField) {
  ferry::v1::JobSpec spec;
  spec.mutable_dataset()->mutable_blend();
  EXPECT_THAT(OpenError(spec).message(), HasSubstr("at least one dataset"));

  spec = BlendSpec({3, 3}, {1, 0});
  EXPECT_THAT(OpenError(spec).message(), HasSubstr("dataset.blend.sources[1].weight"));
  spec = BlendSpec({3, 3}, {1, NAN});
  EXPECT_THAT(OpenError(spec).message(), HasSubstr("positive finite"));
  spec = BlendSpec({3, 3}, {1, -2});
  EXPECT_EQ(OpenError(spec).code(), absl::StatusCode::kInvalidArgument);

  spec = BlendSpec({3, 3}, {1, 1});
  spec.mutable_dataset()->mutable_blend()->mutable_sources(0)->set_name("a b");
  EXPECT_THAT(OpenError(spec).message(), HasSubstr("sources[0].name 'a b'"));
  spec.mutable_dataset()->mutable_blend()->mutable_sources(0)->set_name("source1");
  EXPECT_THAT(OpenError(spec).message(), HasSubstr("used by an earlier source"));

  spec = BlendSpec({3, 3}, {1, 1});
  *spec.mutable_dataset()->mutable_blend()->mutable_sources(1)->mutable_dataset() =
      BlendSpec({3}, {1}).dataset();
  EXPECT_THAT(OpenError(spec).message(), HasSubstr("blends do not nest"));

  spec = BlendSpec({3, 3}, {1, 1});
  spec.mutable_dataset()
      ->mutable_blend()
      ->mutable_sources(1)
      ->mutable_dataset()
      ->mutable_tokens()
      ->set_seq_len(kSeqLen + 1);
  absl::Status mismatch = OpenError(spec);
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatch.message(), HasSubstr("must deliver the same fields"));
  EXPECT_THAT(mismatch.message(), HasSubstr("tokens INT64[6]"));

  spec = BlendSpec({3, 3}, {1, 1});
  spec.mutable_dataset()->mutable_blend()->mutable_sources(1)->set_name("books");
  spec.mutable_dataset()
      ->mutable_blend()
      ->mutable_sources(1)
      ->mutable_dataset()
      ->mutable_tokens()
      ->set_path(dir_ + "/missing.bin");
  absl::Status missing = OpenError(spec);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("dataset.blend.sources[1] ('books')"));

  spec = BlendSpec({3, 3}, {1, 1}, uint64_t{1} << 40);
  EXPECT_THAT(OpenError(spec).message(), HasSubstr("samples_per_epoch"));
}

TEST_F(BlendSourceTest, DatasetPathsListsEverySourcesFiles) {
  const ferry::v1::JobSpec spec = BlendSpec({3, 3}, {1, 1});
  absl::StatusOr<std::vector<std::string>> paths = DatasetPaths(spec.dataset());
  ASSERT_TRUE(paths.ok()) << paths.status();
  EXPECT_THAT(*paths, ::testing::ElementsAre(dir_ + "/s0.bin", dir_ + "/s1.bin"));
}

}  // namespace
}  // namespace ferry
