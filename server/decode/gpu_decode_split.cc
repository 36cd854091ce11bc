#include "server/decode/gpu_decode_split.h"

#include <algorithm>
#include <cmath>

namespace ferry {
namespace {

constexpr int64_t kPpm = 1000000;
// Weight of a new report in the smoothed costs.
constexpr double kSmoothing = 0.05;

void Smooth(double* value, double sample) {
  *value = *value == 0 ? sample : (1 - kSmoothing) * *value + kSmoothing * sample;
}

double InitialBalance(GpuDecodeMode mode) {
  switch (mode) {
    case GpuDecodeMode::kCpu:
      return 0;
    case GpuDecodeMode::kGpu:
      return 1;
    case GpuDecodeMode::kAuto:
      break;
  }
  return GpuDecodeSplit::kInitialShare;
}

}  // namespace

absl::string_view GpuDecodeModeName(GpuDecodeMode mode) {
  switch (mode) {
    case GpuDecodeMode::kCpu:
      return "cpu";
    case GpuDecodeMode::kGpu:
      return "gpu";
    case GpuDecodeMode::kAuto:
      return "auto";
  }
  return "?";
}

GpuDecodeSplit::GpuDecodeSplit(GpuDecodeMode mode, int workers, GpuJpegLimits limits)
    : mode_(mode),
      workers_(std::max(1, workers)),
      limits_(limits),
      balance_ppm_(std::lround(InitialBalance(mode) * kPpm)),
      model_(InitialBalance(mode)),
      balance_(InitialBalance(mode)) {}

GpuDecodeSplit::Rank::Rank(GpuDecodeSplit* split)
    : split_(split), demand_ppm_(split->mode_ == GpuDecodeMode::kGpu ? kPpm : 0) {
  absl::MutexLock lock(&split_->mutex_);
  ++split_->ranks_;
  split_->demand_sum_ppm_ += demand_ppm_.load(std::memory_order_relaxed);
}

GpuDecodeSplit::Rank::~Rank() {
  absl::MutexLock lock(&split_->mutex_);
  --split_->ranks_;
  split_->demand_sum_ppm_ -= demand_ppm_.load(std::memory_order_relaxed);
}

double GpuDecodeSplit::Rank::demand() const {
  return static_cast<double>(demand_ppm_.load(std::memory_order_relaxed)) / kPpm;
}

double GpuDecodeSplit::Rank::share() const { return demand() * split_->balance(); }

bool GpuDecodeSplit::Rank::RouteBatch() {
  // Error diffusion: every batch adds the share to an accumulator, and a batch goes to the
  // GPU when that crosses a whole number. A change of share applies from the next batch on,
  // with no backlog of turns.
  const int64_t share = demand_ppm_.load(std::memory_order_relaxed) *
                        split_->balance_ppm_.load(std::memory_order_relaxed) / kPpm;
  const int64_t before = accumulator_.fetch_add(share, std::memory_order_relaxed);
  return (before + share) / kPpm > before / kPpm;
}

void GpuDecodeSplit::Rank::ReportConsumerWait(double waited, double step) {
  if (split_->mode_ != GpuDecodeMode::kAuto || step <= 0) return;
  absl::MutexLock lock(&split_->mutex_);
  const int64_t was = demand_ppm_.load(std::memory_order_relaxed);
  const int64_t now = waited > kInputBoundWait * step
                          ? std::min(kPpm, was + std::lround(kDemandUp * kPpm))
                          : std::max(int64_t{0}, was - std::lround(kDemandDown * kPpm));
  demand_ppm_.store(now, std::memory_order_relaxed);
  split_->demand_sum_ppm_ += now - was;
}

void GpuDecodeSplit::Rank::ObserveStep(double waited, double step) {
  if (split_->mode_ != GpuDecodeMode::kAuto || step <= 0) return;
  absl::MutexLock lock(&split_->mutex_);
  split_->ObserveStepLocked(waited, step);
}

void GpuDecodeSplit::ObserveStepLocked(double waited, double step) {
  ++window_steps_;
  window_seconds_ += step;
  if (waited > kInputBoundWait * step) ++window_waited_;
  if (window_steps_ < kSearchWindow) return;
  const double mean_step = window_seconds_ / window_steps_;
  const bool input_bound = 2 * window_waited_ > window_steps_;
  window_steps_ = window_waited_ = 0;
  window_seconds_ = 0;
  if (settling_) {
    settling_ = false;
    return;
  }
  if (!input_bound || c_ == 0 || g_ == 0) {
    last_window_step_ = 0;  // the next window starts the comparison afresh
    return;
  }
  if (last_window_step_ > 0 && mean_step > last_window_step_ * (1 + kSearchTolerance)) {
    search_direction_ = -search_direction_;
  }
  last_window_step_ = mean_step;
  search_offset_ += search_direction_ * kSearchStep;
  settling_ = true;
  UpdateShareLocked();
}

GpuDecodeSplit::Decoder& GpuDecodeSplit::Decoder::operator=(Decoder&& other) noexcept {
  if (this != &other) {
    Decoder gone(std::move(*this));
    split_ = std::exchange(other.split_, nullptr);
  }
  return *this;
}

GpuDecodeSplit::Decoder::~Decoder() {
  if (split_ == nullptr) return;
  absl::MutexLock lock(&split_->mutex_);
  --split_->decoders_;
  split_->UpdateShareLocked();
}

GpuDecodeSplit::Decoder GpuDecodeSplit::AddDecoder() {
  absl::MutexLock lock(&mutex_);
  ++decoders_;
  UpdateShareLocked();
  return Decoder(this);
}

int GpuDecodeSplit::decoders() const {
  absl::MutexLock lock(&mutex_);
  return decoders_;
}

void GpuDecodeSplit::CountNotJpeg() {
  not_jpeg_.fetch_add(1, std::memory_order_relaxed);
  cpu_.fetch_add(1, std::memory_order_relaxed);
}

bool GpuDecodeSplit::Route(GpuJpegReject verdict, bool gpu_batch) {
  if (verdict != GpuJpegReject::kNone) {
    fallbacks_[static_cast<int>(verdict)].fetch_add(1, std::memory_order_relaxed);
    cpu_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  eligible_.fetch_add(1, std::memory_order_relaxed);
  (gpu_batch ? gpu_ : cpu_).fetch_add(1, std::memory_order_relaxed);
  return gpu_batch;
}

void GpuDecodeSplit::CountFallback(GpuJpegReject reason) {
  fallbacks_[static_cast<int>(reason)].fetch_add(1, std::memory_order_relaxed);
  gpu_.fetch_sub(1, std::memory_order_relaxed);
  cpu_.fetch_add(1, std::memory_order_relaxed);
}

void GpuDecodeSplit::ReportCpuDecode(double seconds) {
  absl::MutexLock lock(&mutex_);
  Smooth(&c_, seconds);
  UpdateShareLocked();
}

void GpuDecodeSplit::ReportCpuRoute(double seconds) {
  absl::MutexLock lock(&mutex_);
  Smooth(&r_, seconds);
  UpdateShareLocked();
}

void GpuDecodeSplit::ReportGpuBatch(int images, double seconds) {
  if (images <= 0) return;
  absl::MutexLock lock(&mutex_);
  Smooth(&g_, seconds / images);
  UpdateShareLocked();
}

void GpuDecodeSplit::UpdateShareLocked() {
  if (mode_ != GpuDecodeMode::kAuto) return;
  if (c_ > 0 && g_ > 0) {
    // The workers also decode every file the GPU cannot take: a share p of all files.
    int64_t ineligible = not_jpeg_.load(std::memory_order_relaxed);
    for (int r = 1; r < kNumGpuJpegRejects; ++r) {
      ineligible += fallbacks_[r].load(std::memory_order_relaxed);
    }
    const int64_t eligible = eligible_.load(std::memory_order_relaxed);
    const double p =
        eligible > 0 ? static_cast<double>(ineligible) / static_cast<double>(ineligible + eligible)
                     : 0.0;
    const double denominator = (1 - p) * (c_ - r_ + workers_ * g_ / std::max(1, decoders_));
    model_ = denominator > 0 ? std::clamp(c_ / denominator, 0.0, 1.0) : 1.0;
  }
  // An offset past either end would only delay the search's way back.
  search_offset_ = std::clamp(search_offset_, -model_, 1 - model_);
  balance_ = model_ + search_offset_;
  balance_ppm_.store(std::lround(balance_ * kPpm), std::memory_order_relaxed);
}

double GpuDecodeSplit::balance() const {
  return static_cast<double>(balance_ppm_.load(std::memory_order_relaxed)) / kPpm;
}

double GpuDecodeSplit::share() const {
  absl::MutexLock lock(&mutex_);
  return MeanDemandLocked() * balance();
}

double GpuDecodeSplit::MeanDemandLocked() const {
  if (ranks_ == 0) return mode_ == GpuDecodeMode::kGpu ? 1 : 0;
  return static_cast<double>(demand_sum_ppm_) / ranks_ / kPpm;
}

GpuDecodeSplit::Counts GpuDecodeSplit::counts() const {
  Counts c;
  c.gpu_images = gpu_.load(std::memory_order_relaxed);
  c.cpu_images = cpu_.load(std::memory_order_relaxed);
  for (int i = 0; i < kNumGpuJpegRejects; ++i) {
    c.fallbacks[i] = fallbacks_[i].load(std::memory_order_relaxed);
  }
  c.not_jpeg = not_jpeg_.load(std::memory_order_relaxed);
  absl::MutexLock lock(&mutex_);
  c.demand = MeanDemandLocked();
  c.share = c.demand * balance();
  c.cpu_seconds_per_image = c_;
  c.gpu_seconds_per_image = g_;
  c.search_offset = search_offset_;
  c.decoders = decoders_;
  return c;
}

}  // namespace ferry
