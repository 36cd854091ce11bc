// A rank's JPEG decode on its GPU, the part of a CudaStage whose job routes JPEGs to the
// GPU (its host layout has kGpuDecodePlanField and kGpuDecodeJpegField). Per batch, after
// the slot copy: the rows the workers routed hold JPEG bytes in the pinned host slot;
// nvJPEG decodes them (GpuJpegDecoder, on a stream of its own) into one of two arenas, and
// a kernel resamples each through its window into its image row of the device slot, where
// the stage's conversion then finds the pixels the workers would have written. Rows
// nvJPEG refuses, or of a batch it fails, are decoded here on the CPU instead. Each batch's
// decode time goes to the job's GpuDecodeSplit, and each image to the GPU's counters.
// Which batches are routed to the GPU is the rank's turn at the job's GpuDecodeSplit
// (RouteBatch), which follows the rank's trainer's waits (ReportConsumerWait).
//
// Each routed JPEG is first probed (GpuJpegDecoder::Probe: nvJPEG parses its header), host
// work that would otherwise hold the engines idle between two batches. A batch the ring
// reports filled (ProbeAhead) is probed on the stage's probe thread while the batches before
// it decode, so that Enqueue finds its verdicts ready; a batch Enqueue reaches first is
// probed there.
//
//   FERRY_ASSIGN_OR_RETURN(std::unique_ptr<GpuJpegStage> jpeg,
//                          GpuJpegStage::Create(device, job, slab, layout, slots, counters));
//   jpeg->ProbeAhead(host_slot, n);  // as the batch fills
//   FERRY_RETURN_IF_ERROR(jpeg->Enqueue(stream, host_slot, src, dst, device_slot, n));
//
// Ownership: the Job, the slab and `layout` must outlive the stage. Thread safety: Enqueue
// is called by one thread at a time (the CudaStage's StartCopy); it blocks while nvJPEG
// decodes. RouteBatch, ReportConsumerWait, ProbeAhead and ForgetProbe are called by one
// thread at a time (under the ring's lock), beside Enqueue; demand from any thread.
#ifndef FERRY_SERVER_GPU_GPU_JPEG_STAGE_H_
#define FERRY_SERVER_GPU_GPU_JPEG_STAGE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cuda/cuda_resources.h"
#include "server/decode/gpu_decode_split.h"
#include "server/decode/image_transform.h"
#include "server/gpu/device_slot_layout.h"
#include "server/gpu/gpu_counters.h"
#include "server/gpu/host_slot_probes.h"
#include "server/gpu/jpeg/gpu_jpeg_decoder.h"
#include "server/kernels/resample.h"
#include "server/pipeline/job.h"

namespace ferry {

class GpuJpegStage {
 public:
  // The decode of `job`'s routed JPEGs on `device` for `num_device_slots` device slots laid
  // out as `layout`, from the job's host slots in `slab`; null when the job routes none to
  // the GPU. Makes the nvJPEG decoder, its stream, the probe thread, and per device slot the
  // resample jobs (pinned) and timing events; counts the GPU among the job's decoders while
  // it lives. INTERNAL for a layout with one of the two routing fields and not the other;
  // nvJPEG and CUDA errors as they come.
  static absl::StatusOr<std::unique_ptr<GpuJpegStage>> Create(
      int device, const Job& job, const uint8_t* slab, const DeviceSlotLayout& layout,
      int num_device_slots, std::shared_ptr<GpuCounters> counters);

  // Stops the probe thread, then waits for the decode stream.
  ~GpuJpegStage();
  GpuJpegStage(const GpuJpegStage&) = delete;
  GpuJpegStage& operator=(const GpuJpegStage&) = delete;

  // Decodes the routed rows of host slot `host_slot` at `src` (num_samples rows) into the
  // image rows of the device slot `device_slot` at `dst`, in `stream`'s order: the
  // resample and the CPU-decoded rows' copies are enqueued on `stream`, after what it holds
  // (the slot copy), and work enqueued after sees the pixels. Takes the host slot's probe
  // (waiting for it while the probe thread is at it). `device_`'s context is current.
  absl::Status Enqueue(CudaStream& stream, int host_slot, const uint8_t* src, uint8_t* dst,
                       int device_slot, uint32_t num_samples);

  // Host slot `host_slot` holds a filled batch of `num_samples` rows that a later Enqueue
  // decodes: the probe thread probes its routed JPEGs meanwhile. Does not block.
  void ProbeAhead(int host_slot, uint32_t num_samples) { probes_->Queue(host_slot, num_samples); }
  // The batch in `host_slot` will not be decoded: drops its probe; on return the probe
  // thread no longer reads the host slot.
  void ForgetProbe(int host_slot) { probes_->Forget(host_slot); }

  // Whether the batch being planned is one the GPU decodes (the workers route its JPEGs
  // here): GpuDecodeSplit::Rank::RouteBatch.
  bool RouteBatch() { return turn_->RouteBatch(); }
  // The trainer waited `waited` for a batch, `interval` after its release of the one before.
  void ReportConsumerWait(absl::Duration waited, absl::Duration interval) {
    turn_->ReportConsumerWait(absl::ToDoubleSeconds(waited), absl::ToDoubleSeconds(interval));
    turn_->ObserveStep(absl::ToDoubleSeconds(waited), absl::ToDoubleSeconds(interval));
  }
  // The rank's demand for its GPU's decoder (GpuDecodeSplit::Rank::demand).
  double demand() const { return turn_->demand(); }

 private:
  GpuJpegStage() = default;

  // Counts an image of the batch decoded on a CPU, with its GpuDecodePlan::cpu_reason, in
  // the GPU's totals (GpuCounters).
  void CountCpuImage(int32_t reason);
  // Reports the decode time of batches whose timing events completed (GpuDecodeSplit).
  void ReportDecodeTimes();
  // Probes the routed rows of the host slot at `src` (num_samples rows) with `prober`: a
  // verdict per row, kCorrupt for the rows the workers decoded.
  std::vector<GpuJpegVerdict> ProbeRows(GpuJpegDecoder::Prober& prober, const uint8_t* src,
                                        uint32_t num_samples) const;

  // Set in Create, then used by Enqueue's thread only (the probe thread reads the layout,
  // slab_ and the fields too).
  int device_ = 0;
  const SlotLayout* host_ = nullptr;          // the Job's
  const uint8_t* slab_ = nullptr;             // the job's host slots
  const DeviceSlotLayout* layout_ = nullptr;  // the CudaStage's
  std::shared_ptr<GpuCounters> counters_;
  int plan_field_ = -1;                       // kGpuDecodePlanField
  int jpeg_field_ = -1;                       // kGpuDecodeJpegField, the host layout's last
  GpuDecodeSplit* gpu_decode_ = nullptr;      // the Job's, which outlives the stage
  GpuDecodeSplit::Decoder counted_decoder_;   // this GPU among the job's decoders
  std::optional<GpuDecodeSplit::Rank> turn_;  // the rank's turn at the decoder, thread-safe
  std::optional<GpuJpegDecoder> jpeg_decoder_;
  // nvJPEG's stream: on the hardware backend DecodeBatch waits for its stream, which must
  // not hold the slot copies. The copy stream waits for `decoded_` before resampling.
  std::optional<CudaStream> decode_stream_;
  std::optional<CudaEvent> decoded_;
  // Whole decoded images of a batch, grown as needed; batches take the two in turn, and
  // one is written again only once the resample of the batch before last has read it
  // (`free`, recorded on the copy stream, waited for by the host).
  struct DecodeArena {
    std::optional<DeviceBuffer> buffer;
    size_t bytes = 0;
    std::optional<CudaEvent> free;
  };
  std::array<DecodeArena, 2> arenas_;
  int next_arena_ = 0;
  std::vector<DeviceBuffer> resample_jobs_;  // per device slot: batch_size ResampleJobs
  std::vector<std::vector<ResampleJob>> resample_jobs_host_;  // per device slot, pinned:
  std::vector<HostRegistration> resample_jobs_pinned_;        // registered in Create
  std::vector<CudaEvent> decode_started_;  // per device slot, kTiming: on decode_stream_
  std::vector<CudaEvent> decode_done_;     // after the resample, on the copy stream
  std::vector<int> decode_pending_;        // per device slot: images of an unreported timing
  ImageDecoder fallback_decoder_;          // rows nvJPEG cannot decode
  std::vector<uint8_t> fallback_rgb_;
  std::vector<uint8_t> fallback_row_;

  std::optional<GpuJpegDecoder::Prober> prober_;  // the probe thread's; after jpeg_decoder_
  std::optional<HostSlotProbes> probes_;          // reset first by the destructor
};

}  // namespace ferry

#endif  // FERRY_SERVER_GPU_GPU_JPEG_STAGE_H_
