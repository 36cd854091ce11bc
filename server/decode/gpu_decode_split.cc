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
      share_ppm_(mode == GpuDecodeMode::kGpu ? kPpm : 0),
      balance_(InitialBalance(mode)),
      demand_(mode == GpuDecodeMode::kGpu ? 1 : 0) {}

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

bool GpuDecodeSplit::RouteBatch() {
  // Error diffusion: every batch adds the share to an accumulator, and a batch goes to the
  // GPU when that crosses a whole number. A change of share applies from the next batch on,
  // with no backlog of turns.
  const int64_t share = share_ppm_.load(std::memory_order_relaxed);
  const int64_t before = accumulator_.fetch_add(share, std::memory_order_relaxed);
  return (before + share) / kPpm > before / kPpm;
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

void GpuDecodeSplit::ReportConsumerWait(double waited, double step) {
  if (mode_ != GpuDecodeMode::kAuto || step <= 0) return;
  absl::MutexLock lock(&mutex_);
  demand_ = waited > kInputBoundWait * step ? std::min(1.0, demand_ + kDemandUp)
                                            : std::max(0.0, demand_ - kDemandDown);
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
    balance_ = denominator > 0 ? std::clamp(c_ / denominator, 0.0, 1.0) : 1.0;
  }
  share_ppm_.store(static_cast<int64_t>(std::lround(demand_ * balance_ * kPpm)),
                   std::memory_order_relaxed);
}

double GpuDecodeSplit::share() const {
  return static_cast<double>(share_ppm_.load(std::memory_order_relaxed)) / kPpm;
}

GpuDecodeSplit::Counts GpuDecodeSplit::counts() const {
  Counts c;
  c.gpu_images = gpu_.load(std::memory_order_relaxed);
  c.cpu_images = cpu_.load(std::memory_order_relaxed);
  for (int i = 0; i < kNumGpuJpegRejects; ++i) {
    c.fallbacks[i] = fallbacks_[i].load(std::memory_order_relaxed);
  }
  c.not_jpeg = not_jpeg_.load(std::memory_order_relaxed);
  c.share = share();
  absl::MutexLock lock(&mutex_);
  c.demand = demand_;
  c.cpu_seconds_per_image = c_;
  c.gpu_seconds_per_image = g_;
  c.decoders = decoders_;
  return c;
}

}  // namespace ferry
