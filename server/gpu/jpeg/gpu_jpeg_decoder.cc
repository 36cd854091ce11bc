#include "server/gpu/jpeg/gpu_jpeg_decoder.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "cuda/cuda_resources.h"
#include "cuda/cuda_status.h"
#include "cuda/scoped_device.h"
#include "server/gpu/jpeg/internal/nvjpeg_api.h"
#include "server/gpu/jpeg/nvjpeg_library.h"

namespace ferry {

using namespace ::ferry::nvjpeg;  // NOLINT(build/namespaces): nvJPEG's names, as in C

namespace {

void LogIfFailed(nvjpegStatus_t status, const char* call, int device) {
  if (status == NVJPEG_STATUS_SUCCESS) return;
  FERRY_LOG(WARNING) << "releasing nvJPEG state: "
                     << NvJpegStatus(status, call, absl::StrCat("device ", device));
}

// Creating and destroying nvJPEG handles (and the hardware backend's engine sessions behind
// them) is serialised process-wide: nvJPEG documents its handles and states as usable from
// many threads, not that two devices may set theirs up at the same instant, and ferryd
// makes a decoder per GPU stage, whose trainers may all attach together. Decoding is not
// serialised.
ABSL_CONST_INIT absl::Mutex lifecycle_mutex(absl::kConstInit);

}  // namespace

// Owns the nvJPEG objects of one decoder; destroys them (on its device) in reverse order of
// creation, whichever of them exist.
struct GpuJpegDecoder::Impl {
  Impl(const NvJpegLibrary& library, int device, int max_batch, const GpuJpegLimits& limits)
      : lib(library), device(device), max_batch(max_batch), limits(limits) {}
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    ScopedDevice scope(device);
    // Create holds the lock already when it gives up on a half-made decoder.
    std::optional<absl::MutexLock> lock;
    if (!creating) lock.emplace(&lifecycle_mutex);
    if (jpeg_stream != nullptr) {
      LogIfFailed(lib.nvjpegJpegStreamDestroy(jpeg_stream), "nvjpegJpegStreamDestroy", device);
    }
    for (GroupState& group : groups) {
      if (group.state != nullptr) {
        LogIfFailed(lib.nvjpegJpegStateDestroy(group.state), "nvjpegJpegStateDestroy", device);
      }
    }
    if (handle != nullptr) LogIfFailed(lib.nvjpegDestroy(handle), "nvjpegDestroy", device);
  }

  // nvjpegCreateEx with `backend`, first with the interpolation flag when asked for and the
  // library may know it (12 and later), then without.
  absl::Status CreateHandle(nvjpegBackend_t backend, bool interpolate) {
    const char* name =
        backend == NVJPEG_BACKEND_HARDWARE ? "NVJPEG_BACKEND_HARDWARE" : "NVJPEG_BACKEND_DEFAULT";
    const std::string detail = absl::StrCat(name, " on device ", device);
    if (interpolate && lib.major_version() >= 12) {
      const nvjpegStatus_t s = lib.nvjpegCreateEx(backend, nullptr, nullptr,
                                                  kNvjpegFlagsUpsamplingWithInterpolation, &handle);
      if (s == NVJPEG_STATUS_SUCCESS) {
        interpolates_chroma = true;
        return absl::OkStatus();
      }
      handle = nullptr;
    }
    const nvjpegStatus_t s =
        lib.nvjpegCreateEx(backend, nullptr, nullptr, kNvjpegFlagsDefault, &handle);
    if (s != NVJPEG_STATUS_SUCCESS) handle = nullptr;
    return NvJpegStatus(s, "nvjpegCreateEx", detail);
  }

  const NvJpegLibrary& lib;
  bool creating = true;  // until Create hands the decoder out (it holds lifecycle_mutex)
  const int device;
  const int max_batch;
  const GpuJpegLimits limits;
  Backend backend = Backend::kCuda;
  bool interpolates_chroma = false;
  int engines = 0;
  int cores_per_engine = 0;

  // The decode state of one chroma subsampling (nvjpegChromaSubsampling_t's value), made
  // with the decoder. A state is initialised for a batch size and sizes its buffers for the
  // images it decodes; one state per subsampling keeps a batch's groups from initialising
  // and re-sizing one shared state group by group. They are all made up front: making one
  // costs more than a batch's decode, which would then count as decode time.
  struct GroupState {
    nvjpegJpegState_t state = nullptr;
    int initialized_batch = 0;  // of the last nvjpegDecodeBatchedInitialize; 0: none
  };
  static constexpr int kSubsamplings = NVJPEG_CSS_410V + 1;

  // Makes every subsampling's state (and reserves its buffers, where asked). The caller
  // holds lifecycle_mutex.
  absl::Status CreateGroupStates(int preallocate_side) {
    const std::string where = absl::StrCat("device ", device);
    for (int s = 0; s < kSubsamplings; ++s) {
      GroupState& group = groups[static_cast<size_t>(s)];
      const nvjpegStatus_t created = lib.nvjpegJpegStateCreate(handle, &group.state);
      if (created != NVJPEG_STATUS_SUCCESS) {
        group.state = nullptr;
        return NvJpegStatus(created, "nvjpegJpegStateCreate", where);
      }
      if (backend == Backend::kHardware && preallocate_side > 0 &&
          lib.nvjpegDecodeBatchedPreAllocate != nullptr) {
        // Best effort: without it the buffers are allocated on the first batches instead.
        absl::Status reserved =
            NvJpegStatus(lib.nvjpegDecodeBatchedPreAllocate(
                             handle, group.state, max_batch, preallocate_side, preallocate_side,
                             static_cast<nvjpegChromaSubsampling_t>(s), NVJPEG_OUTPUT_RGBI),
                         "nvjpegDecodeBatchedPreAllocate", where);
        if (!reserved.ok()) FERRY_LOG(WARNING) << reserved.message();
      }
    }
    return absl::OkStatus();
  }

  // The state for `subsampling`'s group.
  absl::StatusOr<GroupState*> Group(int subsampling) {
    if (subsampling < 0 || subsampling >= kSubsamplings) {
      return absl::InternalError(
          absl::StrCat("chroma subsampling ", subsampling, ", which Probe does not let through"));
    }
    return &groups[static_cast<size_t>(subsampling)];
  }

  nvjpegHandle_t handle = nullptr;
  std::array<GroupState, kSubsamplings> groups;
  nvjpegJpegStream_t jpeg_stream = nullptr;  // Probe's header parse
  CallStats stats;

  // DecodeBatch's argument arrays, in the order nvJPEG decodes them (grouped by chroma
  // subsampling), and each image's subsampling; reused.
  std::vector<const unsigned char*> data;
  std::vector<size_t> lengths;
  std::vector<nvjpegImage_t> images;
  std::vector<std::pair<int, int>> order;  // (subsampling, index in the batch)
};

absl::string_view GpuJpegDecoder::BackendName(Backend backend) {
  return backend == Backend::kHardware ? "hardware" : "cuda";
}

absl::StatusOr<GpuJpegDecoder> GpuJpegDecoder::Create(int device, int max_batch) {
  return Create(device, max_batch, Options{});
}

absl::StatusOr<GpuJpegDecoder> GpuJpegDecoder::Create(int device, int max_batch,
                                                      const Options& options) {
  FERRY_ASSIGN_OR_RETURN(const NvJpegLibrary* library, NvJpegLibrary::Load());
  return Create(*library, device, max_batch, options);
}

absl::StatusOr<GpuJpegDecoder> GpuJpegDecoder::Create(const NvJpegLibrary& library, int device,
                                                      int max_batch, const Options& options) {
  if (max_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU JPEG decoder batch size ", max_batch, " must be at least 1"));
  }
  FERRY_ASSIGN_OR_RETURN(const int count, DeviceCount());
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device,
                                                   " does not exist; this machine has ", count,
                                                   count == 1 ? " device" : " devices"));
  }
  ScopedDevice scope(device);
  FERRY_RETURN_IF_ERROR(scope.status());
  absl::MutexLock lock(&lifecycle_mutex);

  auto impl = std::make_unique<Impl>(library, device, max_batch, options.limits);
  absl::Status hardware = absl::FailedPreconditionError("not asked for (allow_hardware false)");
  if (options.allow_hardware) {
    hardware = impl->CreateHandle(NVJPEG_BACKEND_HARDWARE, options.interpolate_chroma);
  }
  if (hardware.ok()) {
    impl->backend = Backend::kHardware;
    if (library.nvjpegGetHardwareDecoderInfo != nullptr) {
      unsigned engines = 0, cores = 0;
      if (library.nvjpegGetHardwareDecoderInfo(impl->handle, &engines, &cores) ==
          NVJPEG_STATUS_SUCCESS) {
        impl->engines = static_cast<int>(engines);
        impl->cores_per_engine = static_cast<int>(cores);
      }
    }
  } else {
    FERRY_LOG(INFO) << "device " << device << ": JPEG engines unused, nvJPEG's CUDA decoder "
                    << "instead: " << hardware.message();
    impl->interpolates_chroma = false;
    FERRY_RETURN_IF_ERROR(impl->CreateHandle(NVJPEG_BACKEND_DEFAULT, options.interpolate_chroma));
    impl->backend = Backend::kCuda;
  }
  FERRY_RETURN_IF_ERROR(impl->CreateGroupStates(options.preallocate_side));
  const std::string where = absl::StrCat("device ", device);
  FERRY_RETURN_IF_ERROR(
      NvJpegStatus(library.nvjpegJpegStreamCreate(impl->handle, &impl->jpeg_stream),
                   "nvjpegJpegStreamCreate", where));
  impl->data.resize(max_batch);
  impl->lengths.resize(max_batch);
  impl->images.resize(max_batch);
  impl->order.resize(max_batch);
  impl->creating = false;
  return GpuJpegDecoder(std::move(impl));
}

GpuJpegDecoder::GpuJpegDecoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuJpegDecoder::GpuJpegDecoder(GpuJpegDecoder&&) noexcept = default;
GpuJpegDecoder& GpuJpegDecoder::operator=(GpuJpegDecoder&&) noexcept = default;
GpuJpegDecoder::~GpuJpegDecoder() = default;

int GpuJpegDecoder::device() const { return impl_->device; }
int GpuJpegDecoder::max_batch() const { return impl_->max_batch; }
GpuJpegDecoder::Backend GpuJpegDecoder::backend() const { return impl_->backend; }
bool GpuJpegDecoder::interpolates_chroma() const { return impl_->interpolates_chroma; }
int GpuJpegDecoder::hardware_engines() const { return impl_->engines; }
int GpuJpegDecoder::hardware_cores_per_engine() const { return impl_->cores_per_engine; }
absl::string_view GpuJpegDecoder::library_version() const { return impl_->lib.version(); }
const GpuJpegDecoder::CallStats& GpuJpegDecoder::stats() const { return impl_->stats; }

namespace {

// Probe's decision on `jpeg` for the decoder `d`, parsing it in `parse` (a stream of d's
// handle that no other thread uses meanwhile).
GpuJpegVerdict ProbeWith(const GpuJpegDecoder::Impl& d, nvjpegJpegStream_t parse,
                         absl::Span<const uint8_t> jpeg) {
  GpuJpegVerdict v = ClassifyForGpuDecode(jpeg, d.limits);
  if (v.reason != GpuJpegReject::kNone || d.backend != GpuJpegDecoder::Backend::kHardware) {
    return v;
  }
  const NvJpegLibrary& lib = d.lib;
  if (lib.nvjpegJpegStreamParseHeader(d.handle, jpeg.data(), jpeg.size(), parse) !=
      NVJPEG_STATUS_SUCCESS) {
    v.reason = GpuJpegReject::kCorrupt;
    return v;
  }
  int unsupported = 1;  // 0 means supported
  unsigned width = 0, height = 0;
  if (lib.nvjpegDecodeBatchedSupported(d.handle, parse, &unsupported) != NVJPEG_STATUS_SUCCESS ||
      unsupported != 0 ||
      // DecodeBatch sizes the targets from the verdict: nvJPEG must read the same frame.
      lib.nvjpegJpegStreamGetFrameDimensions(parse, &width, &height) != NVJPEG_STATUS_SUCCESS ||
      width != static_cast<unsigned>(v.width) || height != static_cast<unsigned>(v.height)) {
    v.reason = GpuJpegReject::kDecoderRefused;
  }
  return v;
}

}  // namespace

GpuJpegVerdict GpuJpegDecoder::Probe(absl::Span<const uint8_t> jpeg) {
  return ProbeWith(*impl_, impl_->jpeg_stream, jpeg);
}

absl::StatusOr<GpuJpegDecoder::Prober> GpuJpegDecoder::MakeProber() const {
  const Impl& d = *impl_;
  ScopedDevice scope(d.device);
  FERRY_RETURN_IF_ERROR(scope.status());
  absl::MutexLock lock(&lifecycle_mutex);
  nvjpegJpegStream_t parse = nullptr;
  FERRY_RETURN_IF_ERROR(NvJpegStatus(d.lib.nvjpegJpegStreamCreate(d.handle, &parse),
                                     "nvjpegJpegStreamCreate", absl::StrCat("device ", d.device)));
  return Prober(&d, parse);
}

GpuJpegDecoder::Prober::Prober(const Impl* decoder, nvjpegJpegStream_t parse)
    : decoder_(decoder), parse_(parse) {}

GpuJpegDecoder::Prober::Prober(Prober&& other) noexcept
    : decoder_(std::exchange(other.decoder_, nullptr)),
      parse_(std::exchange(other.parse_, nullptr)) {}

GpuJpegDecoder::Prober& GpuJpegDecoder::Prober::operator=(Prober&& other) noexcept {
  if (this != &other) {
    Prober gone(std::move(*this));
    decoder_ = std::exchange(other.decoder_, nullptr);
    parse_ = std::exchange(other.parse_, nullptr);
  }
  return *this;
}

GpuJpegDecoder::Prober::~Prober() {
  if (parse_ == nullptr) return;
  ScopedDevice scope(decoder_->device);
  absl::MutexLock lock(&lifecycle_mutex);
  LogIfFailed(decoder_->lib.nvjpegJpegStreamDestroy(parse_), "nvjpegJpegStreamDestroy",
              decoder_->device);
}

GpuJpegVerdict GpuJpegDecoder::Prober::Probe(absl::Span<const uint8_t> jpeg) {
  return ProbeWith(*decoder_, parse_, jpeg);
}

namespace {

// The nvJPEG subsampling of a file Probe accepted; -1 for one it never accepts.
int NvJpegSubsampling(JpegSubsampling subsampling) {
  switch (subsampling) {
    case JpegSubsampling::k444:
      return NVJPEG_CSS_444;
    case JpegSubsampling::k422:
      return NVJPEG_CSS_422;
    case JpegSubsampling::k420:
      return NVJPEG_CSS_420;
    case JpegSubsampling::k440:
      return NVJPEG_CSS_440;
    case JpegSubsampling::kGray:
      return NVJPEG_CSS_GRAY;
    default:
      return -1;
  }
}

}  // namespace

absl::Status GpuJpegDecoder::DecodeBatch(absl::Span<const absl::Span<const uint8_t>> jpegs,
                                         absl::Span<const GpuJpegVerdict> verdicts,
                                         absl::Span<const Target> targets, CUstream_st* stream) {
  Impl& d = *impl_;
  const NvJpegLibrary& lib = d.lib;
  const size_t n = jpegs.size();
  if (n != targets.size() || n != verdicts.size()) {
    return absl::InvalidArgumentError(absl::StrCat("GPU JPEG decode of ", n, " images with ",
                                                   verdicts.size(), " verdicts into ",
                                                   targets.size(), " targets: counts differ"));
  }
  if (n == 0 || n > static_cast<size_t>(d.max_batch)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPU JPEG decode batch of ", n, " images; this decoder takes 1 to ", d.max_batch));
  }
  for (size_t i = 0; i < n; ++i) {
    const GpuJpegVerdict& v = verdicts[i];
    const int subsampling = NvJpegSubsampling(v.subsampling);
    if (v.reason != GpuJpegReject::kNone || subsampling < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "image ", i, " of the batch cannot be decoded on the GPU (",
          GpuJpegRejectName(
              v.reason == GpuJpegReject::kNone ? GpuJpegReject::kUnsupportedSubsampling : v.reason),
          "); Probe each image first and decode the refused ones on the CPU"));
    }
    const int w = v.width, h = v.height;
    const Target& t = targets[i];
    const size_t row = static_cast<size_t>(w) * 3;
    const size_t need = t.pitch * static_cast<size_t>(h - 1) + row;
    if (t.data == nullptr || t.pitch < row || t.bytes < need) {
      return absl::InvalidArgumentError(absl::StrCat(
          "target ", i, " of the batch (", t.data == nullptr ? "null, " : "", "pitch ", t.pitch,
          ", ", t.bytes, " bytes) cannot hold ", w, "x", h, " RGB: it needs a pitch of at least ",
          row, " and ", t.pitch >= row ? need : row * h, " bytes"));
    }
    d.order[i] = {subsampling, static_cast<int>(i)};
  }
  // One nvjpegDecodeBatched per chroma subsampling: on the JPEG engines a batch that mixes
  // them (4:2:0 with 4:4:4, gray) decodes several times slower than its parts one after
  // the other (docs/benchmarks.md, "JPEG decode on the GPU").
  std::stable_sort(d.order.begin(), d.order.begin() + static_cast<std::ptrdiff_t>(n));
  for (size_t k = 0; k < n; ++k) {
    const size_t i = static_cast<size_t>(d.order[k].second);
    d.data[k] = jpegs[i].data();
    d.lengths[k] = jpegs[i].size();
    nvjpegImage_t& image = d.images[k];
    image = nvjpegImage_t{};
    image.channel[0] = targets[i].data;
    image.pitch[0] = targets[i].pitch;
  }

  ScopedDevice scope(d.device);
  FERRY_RETURN_IF_ERROR(scope.status());
  // The JPEG engines do not keep the stream's order: they may write the targets before
  // work queued on `stream` has run, and nvJPEG may free and reallocate its buffers while
  // that work is pending (seen to hang in cuMemFree with a busy GPU). So on the hardware
  // backend the stream is drained before the first group, and after the last, so that later
  // work on it sees the pixels; the call blocks until the engines are done in any case.
  // Between groups it is not: what a group leaves on the stream (nvJPEG's colour
  // conversion into that group's targets, from that group's state) shares no memory with
  // the next group, which has a state and targets of its own.
  const bool hardware = d.backend == Backend::kHardware;
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  ++d.stats.batches;
  for (size_t begin = 0; begin < n;) {
    size_t end = begin + 1;
    while (end < n && d.order[end].first == d.order[begin].first) ++end;
    const int count = static_cast<int>(end - begin);
    const std::string detail = absl::StrCat(count, " images on device ", d.device);
    FERRY_ASSIGN_OR_RETURN(Impl::GroupState * group, d.Group(d.order[begin].first));
    if (group->initialized_batch != count) {
      const Clock::time_point start = Clock::now();
      group->initialized_batch = 0;
      FERRY_RETURN_IF_ERROR(
          NvJpegStatus(lib.nvjpegDecodeBatchedInitialize(d.handle, group->state, count,
                                                         /*max_cpu_threads=*/1, NVJPEG_OUTPUT_RGBI),
                       "nvjpegDecodeBatchedInitialize", detail));
      group->initialized_batch = count;
      ++d.stats.initializations;
      d.stats.initialize_seconds += seconds_since(start);
    }
    if (hardware && begin == 0) {
      const Clock::time_point start = Clock::now();
      FERRY_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize",
                                       absl::StrCat("before the GPU JPEG decode of ", detail)));
      ++d.stats.drains;
      d.stats.drain_seconds += seconds_since(start);
    }
    const Clock::time_point start = Clock::now();
    const nvjpegStatus_t s =
        lib.nvjpegDecodeBatched(d.handle, group->state, d.data.data() + begin,
                                d.lengths.data() + begin, d.images.data() + begin, stream);
    d.stats.decode_seconds += seconds_since(start);
    ++d.stats.groups;
    if (s != NVJPEG_STATUS_SUCCESS) {
      group->initialized_batch = 0;  // nvJPEG asks for a new initialisation after a failed batch
      return NvJpegStatus(s, "nvjpegDecodeBatched", detail);
    }
    begin = end;
  }
  if (hardware) {
    const Clock::time_point start = Clock::now();
    absl::Status drained = CudaStatus(
        cudaStreamSynchronize(stream), "cudaStreamSynchronize",
        absl::StrCat("after the GPU JPEG decode of ", n, " images on device ", d.device));
    ++d.stats.drains;
    d.stats.drain_seconds += seconds_since(start);
    return drained;
  }
  return absl::OkStatus();
}

}  // namespace ferry
