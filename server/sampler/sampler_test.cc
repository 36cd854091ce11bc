#include "server/sampler/sampler.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<Sampler> MakeSampler(const SamplerOptions& options) {
  absl::StatusOr<std::unique_ptr<Sampler>> sampler = Sampler::Create(options);
  EXPECT_TRUE(sampler.ok()) << sampler.status();
  return sampler.ok() ? *std::move(sampler) : nullptr;
}

// Every batch of every rank of one epoch: result[rank][batch] = indices.
std::vector<std::vector<std::vector<int64_t>>> WholeEpoch(Sampler& sampler, int64_t epoch) {
  const SamplerOptions& o = sampler.options();
  std::vector<std::vector<std::vector<int64_t>>> result(o.world_size);
  for (int64_t rank = 0; rank < o.world_size; ++rank) {
    for (int64_t batch = 0; batch < sampler.batches_per_epoch(); ++batch) {
      std::vector<int64_t> ids;
      sampler.BatchIndices(epoch, rank, batch, &ids);
      result[rank].push_back(std::move(ids));
    }
  }
  return result;
}

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

TEST(SamplerTest, RejectsOutOfRangeFieldsNamingThem) {
  struct Case {
    SamplerOptions options;
    std::string message;
  };
  const Case cases[] = {
      {{.num_samples = 0, .batch_size = 1, .world_size = 1},
       "num_samples must be at least 1 (got 0)"},
      {{.num_samples = -5, .batch_size = 1, .world_size = 1},
       "num_samples must be at least 1 (got -5)"},
      {{.num_samples = 10, .batch_size = 0, .world_size = 1},
       "batch_size must be at least 1 (got 0)"},
      {{.num_samples = 10, .batch_size = -1, .world_size = 1},
       "batch_size must be at least 1 (got -1)"},
      {{.num_samples = 10, .batch_size = 1, .world_size = 0},
       "world_size must be at least 1 (got 0)"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<Sampler>> sampler = Sampler::Create(c.options);
    EXPECT_EQ(sampler.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(sampler.status().message(), c.message);
  }
}

TEST(SamplerTest, RankWithoutBatchIsFailedPrecondition) {
  // 10 samples over 8 ranks with drop_last: 1 sample per rank, less than one batch of 4.
  absl::StatusOr<std::unique_ptr<Sampler>> sampler =
      Sampler::Create({.num_samples = 10, .batch_size = 4, .world_size = 8, .drop_last = true});
  EXPECT_EQ(sampler.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(sampler.status().message(), HasSubstr("dataset of 10 samples over 8 ranks"));
  EXPECT_THAT(sampler.status().message(), HasSubstr("batch_size 4"));
  EXPECT_THAT(sampler.status().message(), HasSubstr("no batch per rank"));
  EXPECT_THAT(sampler.status().message(),
              HasSubstr("lower batch_size or world_size, or turn off drop_last"));

  // Fewer samples than ranks with drop_last: nothing at all per rank.
  EXPECT_EQ(Sampler::Create({.num_samples = 5, .batch_size = 1, .world_size = 8, .drop_last = true})
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  // Without drop_last the same shapes are padded and give one short batch per rank.
  std::unique_ptr<Sampler> padded =
      MakeSampler({.num_samples = 10, .batch_size = 4, .world_size = 8});
  ASSERT_NE(padded, nullptr);
  EXPECT_EQ(padded->samples_per_rank(), 2);
  EXPECT_EQ(padded->batches_per_epoch(), 1);
}

TEST(SamplerTest, ShuffleOffIsIdentityOrder) {
  std::unique_ptr<Sampler> one = MakeSampler({.num_samples = 10, .batch_size = 4});
  ASSERT_NE(one, nullptr);
  auto epoch = WholeEpoch(*one, 3);
  ASSERT_EQ(epoch[0].size(), 3u);
  EXPECT_THAT(epoch[0][0], ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(epoch[0][1], ElementsAre(4, 5, 6, 7));
  EXPECT_THAT(epoch[0][2], ElementsAre(8, 9));  // short last batch

  // Rank r takes positions r, r + world, ...; the pad repeats the head (0, 1).
  std::unique_ptr<Sampler> three =
      MakeSampler({.num_samples = 10, .batch_size = 2, .world_size = 3});
  ASSERT_NE(three, nullptr);
  auto sharded = WholeEpoch(*three, 0);
  EXPECT_THAT(sharded[0], ElementsAre(ElementsAre(0, 3), ElementsAre(6, 9)));
  EXPECT_THAT(sharded[1], ElementsAre(ElementsAre(1, 4), ElementsAre(7, 0)));
  EXPECT_THAT(sharded[2], ElementsAre(ElementsAre(2, 5), ElementsAre(8, 1)));
}

TEST(SamplerTest, SameSeedAndEpochGiveSameOrderOthersDiffer) {
  const SamplerOptions options = {
      .num_samples = 1000, .batch_size = 1000, .shuffle = true, .seed = 42};
  std::unique_ptr<Sampler> a = MakeSampler(options);
  std::unique_ptr<Sampler> b = MakeSampler(options);
  SamplerOptions other_seed = options;
  other_seed.seed = 43;
  std::unique_ptr<Sampler> c = MakeSampler(other_seed);
  ASSERT_TRUE(a && b && c);

  auto a0 = WholeEpoch(*a, 0)[0][0];
  auto a1 = WholeEpoch(*a, 1)[0][0];
  EXPECT_EQ(WholeEpoch(*b, 0)[0][0], a0);
  EXPECT_EQ(WholeEpoch(*a, 0)[0][0], a0);  // back to a cached-out epoch
  EXPECT_NE(a0, a1);
  EXPECT_NE(WholeEpoch(*c, 0)[0][0], a0);
  EXPECT_NE(a0, Iota(1000));
  std::vector<int64_t> sorted = a0;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, Iota(1000));
}

// The order is part of the wire contract between nodes (no coordinator: every ferryd computes
// it), so it is pinned to the documented algorithm: Fisher-Yates from the back, driven by
// Rng(MixSeed(seed, epoch)).Below.
TEST(SamplerTest, OrderIsFisherYatesOverMixSeed) {
  constexpr int64_t kN = 97;
  std::unique_ptr<Sampler> sampler =
      MakeSampler({.num_samples = kN, .batch_size = kN, .shuffle = true, .seed = 7});
  ASSERT_NE(sampler, nullptr);
  for (int64_t epoch : {0, 1, 12345}) {
    std::vector<int64_t> expected = Iota(kN);
    Rng rng(MixSeed(7, static_cast<uint64_t>(epoch)));
    for (int64_t i = kN - 1; i > 0; --i) {
      std::swap(expected[i], expected[rng.Below(static_cast<uint64_t>(i + 1))]);
    }
    std::vector<int64_t> ids;
    sampler->BatchIndices(epoch, 0, 0, &ids);
    EXPECT_EQ(ids, expected) << "epoch " << epoch;
  }
}

// Checks the DistributedSampler + BatchSampler contract for many shapes by rebuilding the
// epoch's global order from what each rank received (position = local * world + rank).
TEST(SamplerTest, ShardingContractHoldsForManyShapes) {
  int checked = 0;
  for (int64_t n : {1, 2, 3, 5, 7, 8, 10, 16, 17, 63, 64, 100, 101, 1000}) {
    for (int64_t b : {1, 2, 3, 7, 16, 64}) {
      for (int64_t w : {1, 2, 3, 4, 8}) {
        for (bool drop_last : {false, true}) {
          for (bool shuffle : {false, true}) {
            SamplerOptions o = {.num_samples = n,
                                .batch_size = b,
                                .world_size = w,
                                .shuffle = shuffle,
                                .drop_last = drop_last,
                                .seed = 1234};
            const std::string label =
                "N=" + std::to_string(n) + " B=" + std::to_string(b) + " W=" + std::to_string(w) +
                " drop_last=" + std::to_string(drop_last) + " shuffle=" + std::to_string(shuffle);
            const int64_t total = drop_last ? n / w * w : (n + w - 1) / w * w;
            const int64_t per_rank = total / w;
            const int64_t batches = drop_last ? per_rank / b : (per_rank + b - 1) / b;
            absl::StatusOr<std::unique_ptr<Sampler>> created = Sampler::Create(o);
            if (batches == 0) {
              EXPECT_EQ(created.status().code(), absl::StatusCode::kFailedPrecondition) << label;
              continue;
            }
            ASSERT_TRUE(created.ok()) << label << ": " << created.status();
            Sampler& sampler = **created;
            ASSERT_EQ(sampler.samples_per_rank(), per_rank) << label;
            ASSERT_EQ(sampler.batches_per_epoch(), batches) << label;

            auto epoch = WholeEpoch(sampler, 5);
            const int64_t covered = drop_last ? batches * b : per_rank;  // per rank
            std::vector<int64_t> order(covered * w, -1);
            for (int64_t r = 0; r < w; ++r) {
              ASSERT_EQ(static_cast<int64_t>(epoch[r].size()), batches) << label;
              for (int64_t k = 0; k < batches; ++k) {
                const int64_t want = std::min(b, per_rank - k * b);
                ASSERT_EQ(static_cast<int64_t>(epoch[r][k].size()), want)
                    << label << " rank " << r << " batch " << k;
                for (int64_t i = 0; i < want; ++i) {
                  const int64_t id = epoch[r][k][i];
                  ASSERT_GE(id, 0) << label;
                  ASSERT_LT(id, n) << label;
                  order[(k * b + i) * w + r] = id;
                }
              }
            }
            // The first min(N, covered) positions are distinct samples ...
            const int64_t distinct = std::min<int64_t>(n, order.size());
            std::set<int64_t> seen(order.begin(), order.begin() + distinct);
            EXPECT_EQ(static_cast<int64_t>(seen.size()), distinct) << label;
            // ... and everything past N is padding repeating the head of the order.
            for (int64_t p = n; p < static_cast<int64_t>(order.size()); ++p) {
              EXPECT_EQ(order[p], order[p % n]) << label << " position " << p;
            }
            if (!shuffle) {
              for (int64_t p = 0; p < static_cast<int64_t>(order.size()); ++p) {
                EXPECT_EQ(order[p], p % n) << label << " position " << p;
              }
            }
            if (!drop_last) {
              EXPECT_EQ(static_cast<int64_t>(seen.size()), n) << label;  // all samples served
            }
            if (drop_last && n % w == 0 && per_rank % b == 0) {
              std::vector<int64_t> all = order;
              std::sort(all.begin(), all.end());
              EXPECT_EQ(all, Iota(n)) << label;  // every sample exactly once
            }
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST(SamplerTest, MoreRanksThanSamplesWrapsThePadding) {
  std::unique_ptr<Sampler> sampler =
      MakeSampler({.num_samples = 2, .batch_size = 4, .world_size = 5});
  ASSERT_NE(sampler, nullptr);
  auto epoch = WholeEpoch(*sampler, 0);
  // Order padded to 5: 0 1 0 1 0.
  EXPECT_THAT(epoch, ElementsAre(ElementsAre(ElementsAre(0)), ElementsAre(ElementsAre(1)),
                                 ElementsAre(ElementsAre(0)), ElementsAre(ElementsAre(1)),
                                 ElementsAre(ElementsAre(0))));
}

TEST(SamplerTest, ConcurrentCallsMatchSerialResults) {
  const SamplerOptions options = {
      .num_samples = 5003, .batch_size = 64, .world_size = 4, .shuffle = true, .seed = 99};
  constexpr int kEpochs = 6;
  std::unique_ptr<Sampler> serial = MakeSampler(options);
  ASSERT_NE(serial, nullptr);
  std::vector<std::vector<std::vector<std::vector<int64_t>>>> expected;
  for (int e = 0; e < kEpochs; ++e) expected.push_back(WholeEpoch(*serial, e));

  std::unique_ptr<Sampler> shared = MakeSampler(options);
  ASSERT_NE(shared, nullptr);
  constexpr int kThreads = 8;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<int64_t> ids;
      // Interleave epochs so threads keep evicting each other's cached permutation.
      for (int round = 0; round < 20; ++round) {
        const int64_t epoch = (t + round) % kEpochs;
        const int64_t rank = (t * 3 + round) % options.world_size;
        for (int64_t batch = 0; batch < shared->batches_per_epoch(); batch += 3) {
          shared->BatchIndices(epoch, rank, batch, &ids);
          if (ids != expected[epoch][rank][batch]) ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

// A fixed, recognisable order for epoch_order tests: a rotation by 3 * epoch + 1, reversed.
void RotatedReversed(int64_t n, int64_t epoch, std::vector<int64_t>* order) {
  order->resize(n);
  for (int64_t i = 0; i < n; ++i) (*order)[i] = (n - 1 - i + 3 * epoch + 1) % n;
}

TEST(SamplerTest, ContiguousDealsRunsWithTheSameCounts) {
  // Padded: per_rank = ceil(10 / 3) = 4; the last rank's run wraps to the head.
  std::unique_ptr<Sampler> padded =
      MakeSampler({.num_samples = 10, .batch_size = 2, .world_size = 3, .contiguous = true});
  ASSERT_NE(padded, nullptr);
  EXPECT_EQ(padded->samples_per_rank(), 4);
  auto epoch = WholeEpoch(*padded, 0);
  EXPECT_THAT(epoch[0], ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3)));
  EXPECT_THAT(epoch[1], ElementsAre(ElementsAre(4, 5), ElementsAre(6, 7)));
  EXPECT_THAT(epoch[2], ElementsAre(ElementsAre(8, 9), ElementsAre(0, 1)));

  // Cut: per_rank = floor(10 / 3) = 3; sample 9 is dropped, as in strided mode.
  std::unique_ptr<Sampler> cut = MakeSampler(
      {.num_samples = 10, .batch_size = 2, .world_size = 3, .drop_last = true, .contiguous = true});
  ASSERT_NE(cut, nullptr);
  EXPECT_EQ(cut->batches_per_epoch(), 1);  // 3 per rank: one full batch, the rest dropped
  auto cut_epoch = WholeEpoch(*cut, 0);
  EXPECT_THAT(cut_epoch[0], ElementsAre(ElementsAre(0, 1)));
  EXPECT_THAT(cut_epoch[1], ElementsAre(ElementsAre(3, 4)));
  EXPECT_THAT(cut_epoch[2], ElementsAre(ElementsAre(6, 7)));

  // More ranks than samples: the order wraps more than once.
  std::unique_ptr<Sampler> wide =
      MakeSampler({.num_samples = 2, .batch_size = 4, .world_size = 5, .contiguous = true});
  ASSERT_NE(wide, nullptr);
  EXPECT_THAT(WholeEpoch(*wide, 0),
              ElementsAre(ElementsAre(ElementsAre(0)), ElementsAre(ElementsAre(1)),
                          ElementsAre(ElementsAre(0)), ElementsAre(ElementsAre(1)),
                          ElementsAre(ElementsAre(0))));
}

TEST(SamplerTest, EpochOrderReplacesThePermutationAndIsCachedPerEpoch) {
  constexpr int64_t kN = 12;
  int calls = 0;
  std::vector<int64_t> epochs_asked;
  for (bool shuffle : {false, true}) {
    calls = 0;
    epochs_asked.clear();
    SamplerOptions o = {
        .num_samples = kN, .batch_size = 4, .world_size = 1, .shuffle = shuffle, .seed = 9};
    o.epoch_order = [&](int64_t epoch, std::vector<int64_t>* order) {
      ++calls;
      epochs_asked.push_back(epoch);
      RotatedReversed(kN, epoch, order);
    };
    std::unique_ptr<Sampler> sampler = MakeSampler(o);
    ASSERT_NE(sampler, nullptr);
    for (int64_t epoch : {0, 0, 2}) {
      std::vector<int64_t> expected;
      RotatedReversed(kN, epoch, &expected);
      std::vector<int64_t> got;
      const auto batches = WholeEpoch(*sampler, epoch);
      for (const auto& batch : batches[0]) {
        got.insert(got.end(), batch.begin(), batch.end());
      }
      EXPECT_EQ(got, expected) << "shuffle=" << shuffle << " epoch " << epoch;
    }
    EXPECT_EQ(calls, 2) << "shuffle=" << shuffle;
    EXPECT_THAT(epochs_asked, ElementsAre(0, 2));
  }
}

// Workers at the end of one epoch, the read-ahead and other ranks at the start of the next
// ask in turn: each of the two orders is computed once, and a third epoch replaces the one
// asked for least recently.
TEST(SamplerTest, TwoEpochsAskedInTurnAreEachComputedOnce) {
  constexpr int64_t kN = 12;
  std::vector<int64_t> epochs_asked;
  SamplerOptions o = {.num_samples = kN, .batch_size = 4, .world_size = 1, .seed = 9};
  o.epoch_order = [&](int64_t epoch, std::vector<int64_t>* order) {
    epochs_asked.push_back(epoch);
    RotatedReversed(kN, epoch, order);
  };
  std::unique_ptr<Sampler> sampler = MakeSampler(o);
  ASSERT_NE(sampler, nullptr);
  std::vector<int64_t> got;
  auto batch_of = [&](int64_t epoch) {
    sampler->BatchIndices(epoch, 0, 1, &got);
    std::vector<int64_t> order;
    RotatedReversed(kN, epoch, &order);
    EXPECT_THAT(got, ElementsAre(order[4], order[5], order[6], order[7])) << "epoch " << epoch;
  };
  for (int turn = 0; turn < 5; ++turn) {
    batch_of(3);
    batch_of(4);
  }
  EXPECT_THAT(epochs_asked, ElementsAre(3, 4));
  batch_of(5);  // replaces epoch 3's
  batch_of(4);
  batch_of(3);  // replaces epoch 5's
  EXPECT_THAT(epochs_asked, ElementsAre(3, 4, 5, 3));
}

// The shuffled order is the same whether the permutation is kept in 32 bits or not: the
// same Fisher-Yates draws (OrderIsFisherYatesOverMixSeed pins them) over a dataset whose
// epochs alternate.
TEST(SamplerTest, AlternatingEpochsKeepTheirShuffledOrders) {
  SamplerOptions o = {
      .num_samples = 1000, .batch_size = 10, .world_size = 2, .shuffle = true, .seed = 4};
  std::unique_ptr<Sampler> a = MakeSampler(o);
  std::unique_ptr<Sampler> b = MakeSampler(o);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const auto epoch0 = WholeEpoch(*a, 0);
  const auto epoch1 = WholeEpoch(*a, 1);
  std::vector<int64_t> got;
  for (int64_t batch = 0; batch < 50; ++batch) {
    for (int64_t epoch : {1, 0}) {
      for (int64_t rank : {0, 1}) {
        b->BatchIndices(epoch, rank, batch, &got);
        EXPECT_EQ(
            got,
            (epoch == 0 ? epoch0 : epoch1)[static_cast<size_t>(rank)][static_cast<size_t>(batch)]);
      }
    }
  }
}

// The contiguous contract for many shapes, with an epoch_order: rank r's k-th sample is
// order[(r * per_rank + k) % N], every rank gets the same batch count, and without drop_last
// every sample is served.
TEST(SamplerTest, ContiguousContractHoldsForManyShapes) {
  int checked = 0;
  for (int64_t n : {1, 2, 3, 5, 7, 10, 16, 17, 64, 101, 1000}) {
    for (int64_t b : {1, 3, 16, 64}) {
      for (int64_t w : {1, 2, 3, 8}) {
        for (bool drop_last : {false, true}) {
          SamplerOptions o = {.num_samples = n,
                              .batch_size = b,
                              .world_size = w,
                              .shuffle = true,
                              .drop_last = drop_last,
                              .seed = 77};
          o.epoch_order = [n](int64_t epoch, std::vector<int64_t>* order) {
            RotatedReversed(n, epoch, order);
          };
          o.contiguous = true;
          const std::string label = "N=" + std::to_string(n) + " B=" + std::to_string(b) +
                                    " W=" + std::to_string(w) +
                                    " drop_last=" + std::to_string(drop_last);
          const int64_t per_rank = drop_last ? n / w : (n + w - 1) / w;
          const int64_t batches = drop_last ? per_rank / b : (per_rank + b - 1) / b;
          absl::StatusOr<std::unique_ptr<Sampler>> created = Sampler::Create(o);
          if (batches == 0) {
            EXPECT_EQ(created.status().code(), absl::StatusCode::kFailedPrecondition) << label;
            continue;
          }
          ASSERT_TRUE(created.ok()) << label << ": " << created.status();
          Sampler& sampler = **created;
          ASSERT_EQ(sampler.samples_per_rank(), per_rank) << label;
          ASSERT_EQ(sampler.batches_per_epoch(), batches) << label;
          std::vector<int64_t> order;
          RotatedReversed(n, 4, &order);
          std::set<int64_t> served;
          auto epoch = WholeEpoch(sampler, 4);
          for (int64_t r = 0; r < w; ++r) {
            ASSERT_EQ(static_cast<int64_t>(epoch[r].size()), batches) << label;
            int64_t k = 0;
            for (const auto& batch : epoch[r]) {
              for (int64_t id : batch) {
                ASSERT_EQ(id, order[(r * per_rank + k) % n]) << label << " rank " << r;
                served.insert(id);
                ++k;
              }
            }
          }
          if (!drop_last) {
            EXPECT_EQ(static_cast<int64_t>(served.size()), n) << label;
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 250);
}

TEST(SamplerTest, AResumedEpochDealsTheRestOfTheSameShuffledOrder) {
  // 4 ranks of batch 3 take 2 batches of a shuffled epoch; 3 ranks of batch 5 take the rest.
  std::unique_ptr<Sampler> four = MakeSampler(
      {.num_samples = 50, .batch_size = 3, .world_size = 4, .shuffle = true, .seed = 9});
  std::unique_ptr<Sampler> three = MakeSampler(
      {.num_samples = 50, .batch_size = 5, .world_size = 3, .shuffle = true, .seed = 9});
  ASSERT_NE(four, nullptr);
  ASSERT_NE(three, nullptr);
  std::multiset<int64_t> seen;
  std::vector<int64_t> ids;
  for (int64_t rank = 0; rank < 4; ++rank) {
    for (int64_t batch = 0; batch < 2; ++batch) {
      four->BatchIndices(7, rank, batch, &ids);
      seen.insert(ids.begin(), ids.end());
    }
  }
  absl::StatusOr<std::shared_ptr<const EpochLayout>> rest =
      three->ResumedLayout(four->fresh_layout().ConsumedAfter(2));
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ((*rest)->batches(), 2);  // 26 left: 9 per rank (one padding entry), 5 + 4
  for (int64_t rank = 0; rank < 3; ++rank) {
    for (int64_t batch = 0; batch < (*rest)->batches(); ++batch) {
      three->BatchIndices(7, rank, batch, &ids, rest->get());
      seen.insert(ids.begin(), ids.end());
    }
  }
  std::set<int64_t> distinct(seen.begin(), seen.end());
  EXPECT_EQ(distinct.size(), 50u);   // every sample
  EXPECT_EQ(seen.size(), 50u + 1u);  // once, and one padding entry
  EXPECT_FALSE(three->ResumedLayout({{40, 60}}).ok());
}

TEST(SamplerDeathTest, BrokenEpochOrderAborts) {
  SamplerOptions short_order = {.num_samples = 10, .batch_size = 4, .world_size = 2};
  short_order.epoch_order = [](int64_t, std::vector<int64_t>* order) { order->assign(9, 0); };
  std::unique_ptr<Sampler> a = MakeSampler(short_order);
  ASSERT_NE(a, nullptr);
  std::vector<int64_t> ids;
  EXPECT_DEATH(a->BatchIndices(0, 0, 0, &ids), "has the wrong length");

  SamplerOptions repeats = short_order;
  repeats.epoch_order = [](int64_t, std::vector<int64_t>* order) {
    order->assign(10, 0);
    std::iota(order->begin(), order->end() - 1, int64_t{0});
  };
  std::unique_ptr<Sampler> b = MakeSampler(repeats);
  ASSERT_NE(b, nullptr);
  EXPECT_DEATH(b->BatchIndices(0, 0, 0, &ids), "is not a permutation");
}

TEST(SamplerDeathTest, OutOfRangeRequestAborts) {
  std::unique_ptr<Sampler> sampler =
      MakeSampler({.num_samples = 10, .batch_size = 4, .world_size = 2});
  ASSERT_NE(sampler, nullptr);
  std::vector<int64_t> ids;
  EXPECT_DEATH(sampler->BatchIndices(0, 2, 0, &ids), "out of range");
  EXPECT_DEATH(sampler->BatchIndices(0, 0, 2, &ids), "out of range");
}

}  // namespace
}  // namespace ferry
