#include "server/gpu/gpu_jpeg_stage.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "cuda/scoped_device.h"
#include "server/decode/gpu_decode_plan.h"
#include "server/kernels/resample.h"

namespace ferry {

absl::StatusOr<std::unique_ptr<GpuJpegStage>> GpuJpegStage::Create(
    int device, const Job& job, const uint8_t* slab, const DeviceSlotLayout& layout,
    int num_device_slots, std::shared_ptr<GpuCounters> counters) {
  int plan_field = -1, jpeg_field = -1;
  for (size_t f = 0; f < job.layout().fields.size(); ++f) {
    const FieldLayout& field = job.layout().fields[f];
    if (field.internal && field.name == kGpuDecodePlanField) plan_field = static_cast<int>(f);
    if (field.internal && field.name == kGpuDecodeJpegField) jpeg_field = static_cast<int>(f);
  }
  if (job.gpu_decode() == nullptr || (plan_field < 0 && jpeg_field < 0)) return nullptr;
  if (plan_field < 0 || jpeg_field < 0) {
    return absl::InternalError("a GPU-decoding layout needs both its plan and its JPEG field");
  }
  ScopedDevice scope(device);
  FERRY_RETURN_IF_ERROR(scope.status());
  std::unique_ptr<GpuJpegStage> jpeg(new GpuJpegStage());
  jpeg->device_ = device;
  jpeg->host_ = &job.layout();
  jpeg->slab_ = slab;
  jpeg->layout_ = &layout;
  jpeg->counters_ = std::move(counters);
  jpeg->plan_field_ = plan_field;
  jpeg->jpeg_field_ = jpeg_field;
  const int batch = static_cast<int>(job.spec().batch_size());
  FERRY_ASSIGN_OR_RETURN(GpuJpegDecoder decoder, GpuJpegDecoder::Create(device, batch));
  FERRY_LOG(INFO) << "job " << job.identity().id << " on GPU " << device
                  << ": JPEG decode on the GPU (nvJPEG " << decoder.library_version() << ", "
                  << GpuJpegDecoder::BackendName(decoder.backend()) << " backend, "
                  << GpuDecodeModeName(job.gpu_decode()->mode()) << ")";
  jpeg->jpeg_decoder_.emplace(std::move(decoder));
  FERRY_ASSIGN_OR_RETURN(jpeg->prober_, jpeg->jpeg_decoder_->MakeProber());
  FERRY_ASSIGN_OR_RETURN(jpeg->decode_stream_, CudaStream::Create(device));
  FERRY_ASSIGN_OR_RETURN(jpeg->decoded_, CudaEvent::Create(device, CudaEvent::kSync));
  for (DecodeArena& arena : jpeg->arenas_) {
    FERRY_ASSIGN_OR_RETURN(arena.free, CudaEvent::Create(device, CudaEvent::kSync));
  }
  jpeg->gpu_decode_ = job.gpu_decode();
  jpeg->counted_decoder_ = job.gpu_decode()->AddDecoder();
  jpeg->turn_.emplace(job.gpu_decode());
  for (size_t i = 0; i < static_cast<size_t>(num_device_slots); ++i) {
    FERRY_ASSIGN_OR_RETURN(DeviceBuffer jobs,
                           DeviceBuffer::Create(device, sizeof(ResampleJob) * batch));
    // The jobs are written here and copied from pinned memory: a copy from pageable
    // memory would wait for the stream's earlier work (the decode) first.
    jpeg->resample_jobs_host_.emplace_back(batch);
    FERRY_ASSIGN_OR_RETURN(HostRegistration pinned,
                           HostRegistration::Create(device, jpeg->resample_jobs_host_.back().data(),
                                                    sizeof(ResampleJob) * batch));
    jpeg->resample_jobs_pinned_.push_back(std::move(pinned));
    FERRY_ASSIGN_OR_RETURN(CudaEvent started, CudaEvent::Create(device, CudaEvent::kTiming));
    FERRY_ASSIGN_OR_RETURN(CudaEvent done, CudaEvent::Create(device, CudaEvent::kTiming));
    jpeg->resample_jobs_.push_back(std::move(jobs));
    jpeg->decode_started_.push_back(std::move(started));
    jpeg->decode_done_.push_back(std::move(done));
  }
  jpeg->decode_pending_.assign(static_cast<size_t>(num_device_slots), 0);
  jpeg->fallback_decoder_.set_limits(DecodeLimits{});
  GpuJpegStage* stage = jpeg.get();
  jpeg->probes_.emplace(
      [stage](int host_slot, uint32_t num_samples) {
        // nvJPEG's parse is host work; its handle is the device's, which is made current
        // as on every thread of ferryd that calls into CUDA's libraries. No verdicts when
        // that fails: Enqueue then probes the batch on its own thread.
        ScopedDevice scope(stage->device_);
        if (!scope.status().ok()) return std::vector<GpuJpegVerdict>();
        return stage->ProbeRows(
            *stage->prober_,
            stage->slab_ + static_cast<size_t>(host_slot) * stage->host_->slot_bytes, num_samples);
      },
      absl::StrCat("g", device));
  return jpeg;
}

GpuJpegStage::~GpuJpegStage() {
  probes_.reset();  // its thread uses prober_ and reads the slab
  if (!decode_stream_.has_value()) return;
  ScopedDevice scope(device_);
  absl::Status s = decode_stream_->Synchronize();
  if (!s.ok()) FERRY_LOG(WARNING) << "JPEG decode stream of GPU " << device_ << ": " << s;
}

void GpuJpegStage::ReportDecodeTimes() {
  for (size_t d = 0; d < decode_pending_.size(); ++d) {
    if (decode_pending_[d] == 0) continue;
    absl::StatusOr<bool> done = decode_done_[d].IsComplete();
    if (!done.ok() || !*done) continue;
    absl::StatusOr<float> ms = ElapsedMillis(decode_started_[d], decode_done_[d]);
    if (ms.ok()) gpu_decode_->ReportGpuBatch(decode_pending_[d], *ms / 1e3);
    decode_pending_[d] = 0;
  }
}

std::vector<GpuJpegVerdict> GpuJpegStage::ProbeRows(GpuJpegDecoder::Prober& prober,
                                                    const uint8_t* src,
                                                    uint32_t num_samples) const {
  const uint8_t* jpeg_rows = src + host_->offsets[jpeg_field_];
  const size_t jpeg_row_bytes = host_->fields[jpeg_field_].row_bytes;
  const auto* plans = reinterpret_cast<const GpuDecodePlan*>(src + host_->offsets[plan_field_]);
  std::vector<GpuJpegVerdict> verdicts(num_samples);
  for (uint32_t i = 0; i < num_samples; ++i) {
    GpuDecodePlan plan;
    std::memcpy(&plan, &plans[i], sizeof(plan));
    if (plan.on_gpu == 0) continue;
    verdicts[i] =
        prober.Probe(absl::Span<const uint8_t>(jpeg_rows + jpeg_row_bytes * i, plan.jpeg_bytes));
  }
  return verdicts;
}

void GpuJpegStage::CountCpuImage(int32_t reason) {
  counters_->jpeg_cpu_images.fetch_add(1, std::memory_order_relaxed);
  const int index = reason == kPlanNotJpeg ? kNumGpuJpegRejects : reason;
  if (index > 0 && index <= kNumGpuJpegRejects) {
    counters_->jpeg_fallbacks[index].fetch_add(1, std::memory_order_relaxed);
  }
}

absl::Status GpuJpegStage::Enqueue(CudaStream& stream, int host_slot, const uint8_t* src,
                                   uint8_t* dst, int device_slot, uint32_t num_samples) {
  ReportDecodeTimes();
  // The probe thread's verdicts on this batch; when it had not started on it, this thread
  // probes each routed row below.
  std::optional<std::vector<GpuJpegVerdict>> probed = probes_->Take(host_slot);
  if (probed.has_value() && probed->size() != num_samples) probed.reset();
  const int image = 0;  // the image sources' first field
  const FieldLayout& field = host_->fields[image];
  const int size = static_cast<int>(field.shape[0]);
  const uint8_t* jpeg_rows = src + host_->offsets[jpeg_field_];
  const size_t jpeg_row_bytes = host_->fields[jpeg_field_].row_bytes;
  uint8_t* device_rows =
      dst + (layout_->image_field >= 0 ? layout_->convert_input_offset : layout_->offsets[image]);
  const auto* plans = reinterpret_cast<const GpuDecodePlan*>(src + host_->offsets[plan_field_]);
  // The rows to decode here, and where each decoded image goes in the arena.
  std::vector<uint32_t> rows, cpu_rows;
  std::vector<absl::Span<const uint8_t>> jpegs;
  std::vector<GpuJpegVerdict> verdicts;
  std::vector<size_t> arena_offsets;
  size_t arena_bytes = 0;
  for (uint32_t i = 0; i < num_samples; ++i) {
    GpuDecodePlan plan;
    std::memcpy(&plan, &plans[i], sizeof(plan));
    if (plan.on_gpu == 0) {  // the worker decoded it
      CountCpuImage(plan.cpu_reason);
      continue;
    }
    const absl::Span<const uint8_t> jpeg(jpeg_rows + jpeg_row_bytes * i, plan.jpeg_bytes);
    const GpuJpegVerdict verdict = probed.has_value() ? (*probed)[i] : jpeg_decoder_->Probe(jpeg);
    if (verdict.reason != GpuJpegReject::kNone || verdict.width != plan.width ||
        verdict.height != plan.height) {
      const GpuJpegReject reason =
          verdict.reason == GpuJpegReject::kNone ? GpuJpegReject::kDecoderRefused : verdict.reason;
      gpu_decode_->CountFallback(reason);
      CountCpuImage(static_cast<int32_t>(reason));
      cpu_rows.push_back(i);
      continue;
    }
    rows.push_back(i);
    jpegs.push_back(jpeg);
    verdicts.push_back(verdict);
    arena_offsets.push_back(arena_bytes);
    arena_bytes += (static_cast<size_t>(plan.width) * plan.height * 3 + 255) / 256 * 256;
  }
  if (!rows.empty()) {
    DecodeArena& decode_arena = arenas_[next_arena_];
    next_arena_ = 1 - next_arena_;
    // The resample of the batch before last may still be reading this arena.
    FERRY_RETURN_IF_ERROR(decode_arena.free->Synchronize());
    if (arena_bytes > decode_arena.bytes) {
      // Grows to the largest batch seen (a quarter more, so that growth is rare).
      decode_arena.buffer.reset();
      const size_t grown = arena_bytes + arena_bytes / 4;
      FERRY_ASSIGN_OR_RETURN(decode_arena.buffer, DeviceBuffer::Create(device_, grown));
      decode_arena.bytes = grown;
    }
    auto* arena = static_cast<uint8_t*>(decode_arena.buffer->data());
    std::vector<GpuJpegDecoder::Target> targets;
    std::vector<ResampleJob>& jobs = resample_jobs_host_[device_slot];
    jobs.clear();
    for (size_t k = 0; k < rows.size(); ++k) {
      GpuDecodePlan plan;
      std::memcpy(&plan, &plans[rows[k]], sizeof(plan));
      const size_t pitch = static_cast<size_t>(plan.width) * 3;
      targets.push_back({arena + arena_offsets[k], pitch, pitch * plan.height});
      ResampleJob job;
      job.src = reinterpret_cast<uint64_t>(arena + arena_offsets[k]);
      job.dst = reinterpret_cast<uint64_t>(device_rows + field.row_bytes * rows[k]);
      job.x0 = plan.x0, job.x1 = plan.x1, job.y0 = plan.y0, job.y1 = plan.y1;
      job.width = plan.width, job.height = plan.height, job.pitch = static_cast<int32_t>(pitch);
      job.clamp_x0 = plan.clamp_x0, job.clamp_x1 = plan.clamp_x1;
      job.clamp_y0 = plan.clamp_y0, job.clamp_y1 = plan.clamp_y1;
      job.mirror = plan.mirror;
      FERRY_RETURN_IF_ERROR(CheckResampleJob(job));
      jobs.push_back(job);
    }
    FERRY_RETURN_IF_ERROR(decode_stream_->Record(decode_started_[device_slot]));
    absl::Status decoded =
        jpeg_decoder_->DecodeBatch(jpegs, verdicts, targets, decode_stream_->get());
    if (decoded.ok()) {
      FERRY_RETURN_IF_ERROR(decode_stream_->Record(*decoded_));
      FERRY_RETURN_IF_ERROR(stream.Wait(*decoded_));
      // `jobs` (pinned) is rewritten only for this device slot's next batch, after this one.
      void* device_jobs = resample_jobs_[device_slot].data();
      FERRY_RETURN_IF_ERROR(
          stream.CopyAsync(device_jobs, jobs.data(), jobs.size() * sizeof(ResampleJob)));
      FERRY_RETURN_IF_ERROR(LaunchResampleWindows(static_cast<const ResampleJob*>(device_jobs),
                                                  static_cast<int>(jobs.size()), size,
                                                  stream.get()));
      FERRY_RETURN_IF_ERROR(stream.Record(*decode_arena.free));
      FERRY_RETURN_IF_ERROR(stream.Record(decode_done_[device_slot]));
      decode_pending_[device_slot] = static_cast<int>(rows.size());
      counters_->jpeg_gpu_images.fetch_add(static_cast<int64_t>(rows.size()),
                                           std::memory_order_relaxed);
    } else {
      // nvJPEG found the data corrupt while decoding: the whole batch on the CPU.
      FERRY_LOG(WARNING) << "GPU " << device_ << ": nvJPEG failed a batch of " << rows.size()
                         << " images (" << decoded.message() << "); decoding them on the CPU";
      for (uint32_t row : rows) {
        gpu_decode_->CountFallback(GpuJpegReject::kDecoderRefused);
        CountCpuImage(static_cast<int32_t>(GpuJpegReject::kDecoderRefused));
        cpu_rows.push_back(row);
      }
    }
  }
  // Rows the GPU could not take after all, decoded and resampled here as the workers would.
  for (uint32_t i : cpu_rows) {
    GpuDecodePlan plan;
    std::memcpy(&plan, &plans[i], sizeof(plan));
    const absl::Span<const uint8_t> jpeg(jpeg_rows + jpeg_row_bytes * i, plan.jpeg_bytes);
    int width = 0, height = 0;
    fallback_row_.assign(field.row_bytes, 0);
    absl::Status s = fallback_decoder_.DecodeRgb(jpeg, &fallback_rgb_, &width, &height);
    if (s.ok() && width == plan.width && height == plan.height) {
      SourceWindow w;
      w.x0 = plan.x0, w.x1 = plan.x1, w.y0 = plan.y0, w.y1 = plan.y1;
      w.clamp_x0 = plan.clamp_x0, w.clamp_x1 = plan.clamp_x1;
      w.clamp_y0 = plan.clamp_y0, w.clamp_y1 = plan.clamp_y1;
      w.mirror = plan.mirror != 0;
      ResampleWindow(fallback_rgb_.data(), width, height, w, size, fallback_row_.data());
    } else {
      // The workers found its header whole; its data is not. The row stays black.
      FERRY_LOG(WARNING) << "GPU " << device_ << ": a JPEG routed to the GPU does not decode ("
                         << (s.ok() ? "its size changed" : s.message()) << "); its row is black";
    }
    // From pageable memory: staged before CopyAsync returns.
    FERRY_RETURN_IF_ERROR(
        stream.CopyAsync(device_rows + field.row_bytes * i, fallback_row_.data(), field.row_bytes));
  }
  return absl::OkStatus();
}

}  // namespace ferry
