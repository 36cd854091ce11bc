// Which JPEGs of a GPU job the GPU's decoder takes and which the CPU workers decode, and the
// counts behind the answer. One per job, shared by its workers (who ask per sample) and its
// device stages (which report what each GPU batch cost).
//
// Modes (DaemonConfig.gpu_decode): kCpu never routes to the GPU; kGpu routes every file the
// GPU can decode (ClassifyForGpuDecode); kAuto routes the share f of those files that keeps
// both sides busy, from measured costs:
//   c = CPU seconds to decode (and crop) one image on a worker,
//   r = CPU seconds a worker spends on an image it routes to the GPU (read, parse, copy),
//   g = GPU seconds per image of a GPU batch (decode + resample, measured on the stream),
//   W = the job's workers,
//   G = the GPUs decoding for the job (one per device stage that routes: a job shared by
//       the ranks of 4 GPUs has 4 decoders, each taking its own rank's files),
// and p = the share of all files the GPU cannot take (the workers decode those too), so
// that per file the workers' time (p c + (1 - p)((1 - f) c + f r)) / W equals the GPUs'
// (1 - p) f g / G:
//   f = c / ((1 - p)(c - r + W g / G)), clamped to [0, 1],
// starting from kInitialShare until both sides have reported. Costs are smoothed
// (exponentially, per report); p counts every file so far.
//
// But the GPU's decode shares the GPU with the trainer (its work time-slices with the
// trainer's kernels), so in kAuto it only takes files while the trainer waits for batches:
// a rank's share is d f, where its demand d in [0, 1] starts at 0 and follows its own
// trainer's waits (Rank::ReportConsumerWait): a batch the trainer waited for more than
// kInputBoundWait of its step raises d by kDemandUp, any other lowers it by kDemandDown. A
// trainer that the workers alone keep ahead of (compute-bound) thus never pays for the GPU
// decode; an input-bound one gets it within a few batches.
//
// The cost model treats the two sides as independent, and they are not: workers decoding on
// every core slow the GPU's decode thread (the host work of its nvJPEG calls) and
// each other, so the measured g and c rise with the CPU's share, and f settles where both
// sides are slowed rather than where the batches come fastest (docs/operations.md). So
// kAuto also searches: the balance is the model's f plus an offset that a perturb-and-
// observe search moves by kSearchStep after each window of kSearchWindow input-bound steps
// (Rank::ObserveStep: the trainers' steps while they wait for batches, whose length is then
// the time the node takes per batch): on in the same direction, first towards the GPU, until
// the mean step grows by more than kSearchTolerance (noise does not turn it), then back
// the other way. The window after a move is not measured (it holds batches planned before
// the move). A window of steps the trainers did not wait for (their own compute sets its
// length) says nothing about the split: the search holds still and measures afresh. With
// no ObserveStep the balance is the model's.
//
// Demand and turns are per rank (GpuDecodeSplit::Rank), because each rank's batches are
// decoded by its own GPU: under DDP the rank short of batches waits for them while the
// others wait in the all-reduce for it, so a job-wide demand would be outvoted by the ranks
// that do not wait, and one job-wide turn order could hand one GPU every GPU batch.
//
// Files the GPU cannot take go to the CPU in every mode, counted by reason. The share is
// given in whole batches: Rank::RouteBatch(), asked once per batch as the rank schedules
// it, hands out GPU batches so that after n of the rank's batches round(n share) of them
// went to the GPU, whatever thread asks; every file of such a batch that the GPU can take
// goes to it (Route), none of the other batches'. nvJPEG's engines decode a batch of many
// files several times faster per file than a few, so a thin share of every batch would
// leave them mostly idle. The share of files follows the share of batches over many
// batches.
//
// Thread safety: every method may be called from any thread.
#ifndef FERRY_SERVER_DECODE_GPU_DECODE_SPLIT_H_
#define FERRY_SERVER_DECODE_GPU_DECODE_SPLIT_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/decode/jpeg_header.h"

namespace ferry {

enum class GpuDecodeMode { kCpu, kGpu, kAuto };

// "cpu", "gpu", "auto".
absl::string_view GpuDecodeModeName(GpuDecodeMode mode);

class GpuDecodeSplit {
 public:
  static constexpr double kInitialShare = 0.5;
  static constexpr double kInputBoundWait = 0.02;  // of the trainer's step
  static constexpr double kDemandUp = 0.1;
  static constexpr double kDemandDown = 0.05;
  static constexpr int kSearchWindow = 16;          // steps a measured window holds
  static constexpr double kSearchStep = 0.05;       // the offset's change per move
  static constexpr double kSearchTolerance = 0.02;  // a longer mean step that turns it back

  // `limits`: what the GPU takes at most (DaemonConfig.decode_limits.max_image_pixels).
  GpuDecodeSplit(GpuDecodeMode mode, int workers, GpuJpegLimits limits = GpuJpegLimits());

  GpuDecodeMode mode() const { return mode_; }
  const GpuJpegLimits& limits() const { return limits_; }

  // One rank's turn at its GPU's decoder: its demand d and its error-diffusion turn (see
  // above). Counted in the job's demand while it lives; the split must outlive it.
  class Rank {
   public:
    explicit Rank(GpuDecodeSplit* split);
    Rank(const Rank&) = delete;
    Rank& operator=(const Rank&) = delete;
    ~Rank();

    // Whether the batch this rank is scheduling is one its GPU's decoder takes.
    bool RouteBatch();
    // The rank's trainer waited `waited` seconds for a batch, out of `step` seconds since it
    // released the one before.
    void ReportConsumerWait(double waited, double step);
    // The same step, for the job's search of the balance (kAuto; see above).
    void ObserveStep(double waited, double step);
    double demand() const;
    // This rank's share of eligible files now: d f (1 in kGpu, 0 in kCpu).
    double share() const;

   private:
    GpuDecodeSplit* const split_;
    std::atomic<int64_t> demand_ppm_;      // d in millionths, read by RouteBatch without a lock
    std::atomic<int64_t> accumulator_{0};  // millionths of a GPU batch
  };

  // A file the GPU could decode (verdict kNone) or not (its reason), of a batch RouteBatch
  // gave the GPU or not: true when this one goes to the GPU. Counts every call: fallbacks by
  // reason, eligible files, files routed.
  bool Route(GpuJpegReject verdict, bool gpu_batch);
  // The GPU could not decode a routed file after all (the batch failed): the worker-side
  // decode that replaced it is counted under `reason`.
  void CountFallback(GpuJpegReject reason);
  // A file that is not a JPEG (a PNG): the workers decode it.
  void CountNotJpeg();

  // One GPU decoding for the job (G above) while the handle lives. Movable.
  class Decoder {
   public:
    Decoder() = default;
    Decoder(Decoder&& other) noexcept : split_(std::exchange(other.split_, nullptr)) {}
    Decoder& operator=(Decoder&& other) noexcept;
    ~Decoder();

   private:
    friend class GpuDecodeSplit;
    explicit Decoder(GpuDecodeSplit* split) : split_(split) {}
    GpuDecodeSplit* split_ = nullptr;
  };
  // The split must outlive the handle.
  Decoder AddDecoder();
  int decoders() const;

  // Costs as measured (seconds).
  void ReportCpuDecode(double seconds);  // c, per image a worker decoded
  void ReportCpuRoute(double seconds);   // r, per image a worker routed to the GPU
  void ReportGpuBatch(int images, double seconds);
  // f: the share of eligible files a rank of demand 1 routes to its GPU (1 in kGpu, 0 in
  // kCpu): in kAuto the model's, plus the search's offset.
  double balance() const;
  // The ranks' mean share now: mean(d) f (1 in kGpu, 0 in kCpu; 0 in kAuto with no rank).
  double share() const;

  struct Counts {
    int64_t gpu_images = 0;  // decoded by the GPU
    int64_t cpu_images = 0;  // decoded by the workers (fallbacks included)
    std::array<int64_t, kNumGpuJpegRejects> fallbacks{};  // by GpuJpegReject; [kNone] unused
    int64_t not_jpeg = 0;
    double share = 0;                  // the ranks' mean
    double demand = 0;                 // the ranks' mean d (1 in kGpu, 0 in kCpu)
    double cpu_seconds_per_image = 0;  // c (0 before a report)
    double gpu_seconds_per_image = 0;  // g (0 before a report)
    double search_offset = 0;          // what the search added to the model's f
    int decoders = 0;                  // G
  };
  Counts counts() const;

 private:
  void UpdateShareLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void ObserveStepLocked(double waited, double step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  double MeanDemandLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const GpuDecodeMode mode_;
  const int workers_;
  const GpuJpegLimits limits_;
  std::atomic<int64_t> not_jpeg_{0};
  std::atomic<int64_t> eligible_{0};  // Route() calls with kNone
  std::atomic<int64_t> gpu_{0};       // of which routed to the GPU
  std::atomic<int64_t> cpu_{0};
  std::array<std::atomic<int64_t>, kNumGpuJpegRejects> fallbacks_{};
  // f in millionths, read by Rank::RouteBatch without the lock.
  std::atomic<int64_t> balance_ppm_;

  mutable absl::Mutex mutex_;
  double c_ ABSL_GUARDED_BY(mutex_) = 0;
  double r_ ABSL_GUARDED_BY(mutex_) = 0;
  double g_ ABSL_GUARDED_BY(mutex_) = 0;
  double model_ ABSL_GUARDED_BY(mutex_);    // f as the costs give it
  double balance_ ABSL_GUARDED_BY(mutex_);  // f: model_ + search_offset_
  // The search: the offset, the direction of its next move, the window being measured,
  // the last measured window's mean step (0: none to compare with), and whether the window
  // under way follows a move (not measured).
  double search_offset_ ABSL_GUARDED_BY(mutex_) = 0;
  double search_direction_ ABSL_GUARDED_BY(mutex_) = 1;
  int window_steps_ ABSL_GUARDED_BY(mutex_) = 0;
  int window_waited_ ABSL_GUARDED_BY(mutex_) = 0;
  double window_seconds_ ABSL_GUARDED_BY(mutex_) = 0;
  double last_window_step_ ABSL_GUARDED_BY(mutex_) = 0;
  bool settling_ ABSL_GUARDED_BY(mutex_) = false;
  int64_t demand_sum_ppm_ ABSL_GUARDED_BY(mutex_) = 0;  // of the living ranks' d
  int ranks_ ABSL_GUARDED_BY(mutex_) = 0;
  int decoders_ ABSL_GUARDED_BY(mutex_) = 0;  // G
};

}  // namespace ferry

#endif  // FERRY_SERVER_DECODE_GPU_DECODE_SPLIT_H_
