#include "server/sampler/sampler.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "common/status_macros.h"

namespace ferry {

absl::StatusOr<std::unique_ptr<Sampler>> Sampler::Create(const SamplerOptions& options) {
  if (options.num_samples <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_samples must be at least 1 (got ", options.num_samples, ")"));
  }
  // The layout checks batch_size and world_size.
  FERRY_ASSIGN_OR_RETURN(EpochLayout fresh,
                         EpochLayout::Make({.num_positions = options.num_samples,
                                            .world_size = options.world_size,
                                            .batch_size = options.batch_size,
                                            .drop_last = options.drop_last,
                                            .contiguous = options.contiguous,
                                            .micro_batches = options.micro_batches}));
  std::unique_ptr<Sampler> sampler(new Sampler(options, std::move(fresh)));
  if (sampler->batches_per_epoch() == 0) {
    // Only reachable with drop_last: without it every rank gets at least one (short) batch.
    return absl::FailedPreconditionError(
        absl::StrCat("dataset of ", options.num_samples, " samples over ", options.world_size,
                     " ranks with batch_size ", options.batch_size,
                     " and drop_last gives no batch per rank (", sampler->samples_per_rank(),
                     " samples per rank); lower batch_size or world_size, or turn off drop_last"));
  }
  return sampler;
}

Sampler::Sampler(const SamplerOptions& options, EpochLayout fresh)
    : options_(options), fresh_(std::move(fresh)) {}

absl::StatusOr<std::shared_ptr<const EpochLayout>> Sampler::ResumedLayout(
    std::vector<PositionRange> consumed) const {
  EpochLayout::Options o = fresh_.options();
  o.consumed = std::move(consumed);
  FERRY_ASSIGN_OR_RETURN(EpochLayout layout, EpochLayout::Make(std::move(o)));
  return std::make_shared<const EpochLayout>(std::move(layout));
}

void Sampler::BatchIndices(int64_t epoch, int64_t rank, int64_t batch, std::vector<int64_t>* out,
                           const EpochLayout* layout) {
  BatchPositions(epoch, rank, batch, out, layout);
  MapPositions(epoch, absl::MakeSpan(*out));
}

void Sampler::MapPositions(int64_t epoch, absl::Span<int64_t> positions) const {
  if (options_.map_positions) options_.map_positions(epoch, positions);
}

void Sampler::BatchPositions(int64_t epoch, int64_t rank, int64_t batch, std::vector<int64_t>* out,
                             const EpochLayout* layout) {
  if (layout == nullptr) layout = &fresh_;
  if (rank < 0 || rank >= options_.world_size || batch < 0 || batch >= layout->batches()) {
    // A caller bug (requests are validated at the service edge); continuing would hand out
    // indices of another rank or past the dataset.
    std::fprintf(stderr,
                 "ferry: Sampler::BatchPositions(epoch=%lld, rank=%lld, batch=%lld) out of range "
                 "(world_size=%lld, batches in the epoch=%lld)\n",
                 static_cast<long long>(epoch), static_cast<long long>(rank),
                 static_cast<long long>(batch), static_cast<long long>(options_.world_size),
                 static_cast<long long>(layout->batches()));
    std::abort();
  }
  // Where the batch lies in the epoch's order, then what the order holds there.
  layout->BatchPositions(rank, batch, out);
  if (!options_.shuffle && !options_.epoch_order) return;
  absl::MutexLock lock(&mutex_);
  const Order& order = OrderOf(epoch);
  // Positions past the dataset are padding: they repeat the head of the order (and wrap again
  // when there are more ranks than samples), as DistributedSampler does.
  for (int64_t& p : *out) p = order.At(static_cast<size_t>(p % options_.num_samples));
}

const Sampler::Order& Sampler::OrderOf(int64_t epoch) {
  ++uses_;
  for (Order& order : orders_) {
    if (order.epoch == epoch) {
      order.used = uses_;
      return order;
    }
  }
  Order& order = orders_[orders_[0].used <= orders_[1].used ? 0 : 1];
  order.epoch = epoch;
  order.used = uses_;
  const bool narrow = options_.num_samples <= int64_t{1} << 32;
  order.narrow.clear();
  order.wide.clear();
  if (options_.epoch_order) {
    std::vector<int64_t> given;
    options_.epoch_order(epoch, &given);
    CheckEpochOrder(epoch, given);
    if (narrow) {
      order.narrow.assign(given.begin(), given.end());
    } else {
      order.wide = std::move(given);
    }
    return order;
  }
  // Fisher-Yates from the back, so the result depends only on (seed, epoch, num_samples).
  auto shuffle = [&](auto& permutation) {
    permutation.resize(static_cast<size_t>(options_.num_samples));
    using Value = typename std::decay_t<decltype(permutation)>::value_type;
    std::iota(permutation.begin(), permutation.end(), Value{0});
    Rng rng(MixSeed(options_.seed, static_cast<uint64_t>(epoch)));
    for (int64_t i = options_.num_samples - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1));
      std::swap(permutation[static_cast<size_t>(i)], permutation[static_cast<size_t>(j)]);
    }
  };
  if (narrow) {
    shuffle(order.narrow);
  } else {
    shuffle(order.wide);
  }
  return order;
}

void Sampler::CheckEpochOrder(int64_t epoch, const std::vector<int64_t>& order) {
  // A broken order would silently serve some samples twice and others never, on every rank
  // of every node: stop instead, as for any other caller bug.
  const int64_t n = options_.num_samples;
  const char* problem = nullptr;
  if (static_cast<int64_t>(order.size()) != n) {
    problem = "has the wrong length";
  } else {
    std::vector<bool> seen(static_cast<size_t>(n), false);
    for (int64_t v : order) {
      if (v < 0 || v >= n || seen[static_cast<size_t>(v)]) {
        problem = "is not a permutation of [0, num_samples)";
        break;
      }
      seen[static_cast<size_t>(v)] = true;
    }
  }
  if (problem == nullptr) return;
  std::fprintf(stderr,
               "ferry: Sampler epoch_order for epoch %lld %s (%zu entries, num_samples=%lld)\n",
               static_cast<long long>(epoch), problem, order.size(), static_cast<long long>(n));
  std::abort();
}

}  // namespace ferry
