// Batched JPEG decode on one GPU with nvJPEG (loaded at run time, nvjpeg_library.h): on the
// GPU's JPEG engines (NVJPEG_BACKEND_HARDWARE: A100, H100 and later) where it has them, else
// nvJPEG's CUDA decoder (NVJPEG_BACKEND_DEFAULT). Each image is decoded whole, as interleaved
// RGB uint8, into caller-owned device memory; a grayscale JPEG comes out with its luminance
// in all three channels. Which files go here is Probe's decision (ClassifyForGpuDecode's
// rules plus nvJPEG's own check on the device); the rest are the CPU's.
//
//   FERRY_ASSIGN_OR_RETURN(GpuJpegDecoder decoder, GpuJpegDecoder::Create(device, 128));
//   GpuJpegVerdict v = decoder.Probe(bytes);        // v.reason == kNone: the GPU takes it
//   targets[i] = {buffer, v.width * 3, bytes_of_buffer};
//   FERRY_RETURN_IF_ERROR(decoder.DecodeBatch(jpegs, verdicts, targets, stream));
//   ... work on `stream` after this sees the pixels ...
//
// Memory: the compressed bytes may be ordinary (pageable) host memory: nvJPEG copies them
// into pinned staging buffers of its own (cudaHostAlloc, kept and grown by the decoder's
// state) before the transfer. They and the targets must stay valid and unchanged until the
// decode has completed (DecodeBatch says when). nvJPEG also keeps device scratch
// (cudaMalloc) per decoder and chroma subsampling, grown to the largest batch seen.
//
// Thread safety: a decoder is used by one thread at a time (Probe and DecodeBatch share
// nvJPEG state); make one per worker that decodes. Decoders on the same or different devices
// may run concurrently.
#ifndef FERRY_SERVER_GPU_JPEG_GPU_JPEG_DECODER_H_
#define FERRY_SERVER_GPU_JPEG_GPU_JPEG_DECODER_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/decode/jpeg_header.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*
namespace ferry::nvjpeg {
struct nvjpegJpegStream;  // nvjpegJpegStream_t is nvjpegJpegStream* (internal/nvjpeg_api.h)
}  // namespace ferry::nvjpeg

namespace ferry {

class NvJpegLibrary;

class GpuJpegDecoder final {
 public:
  enum class Backend {
    kHardware,  // NVJPEG_BACKEND_HARDWARE: the JPEG engines
    kCuda,      // NVJPEG_BACKEND_DEFAULT: Huffman decode on the GPU's SMs (or the CPU)
  };
  // "hardware" or "cuda".
  static absl::string_view BackendName(Backend backend);

  struct Options {
    // Use the JPEG engines when the GPU has them. Default: true.
    bool allow_hardware = true;
    // Interpolate chroma when upsampling 4:2:0/4:2:2/4:4:0 (as libjpeg does), where nvJPEG
    // knows how (NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION, CUDA 12 and later); otherwise
    // chroma is replicated. Default: true.
    bool interpolate_chroma = true;
    // Files larger than this go to the CPU (kTooLarge). Default: GpuJpegLimits{}.
    GpuJpegLimits limits;
    // Hardware backend: reserve the engines' buffers for max_batch images of up to
    // preallocate_side x preallocate_side (nvjpegDecodeBatchedPreAllocate, where the
    // library has it) for each chroma subsampling's decode state when the decoder is made,
    // instead of on a batch of a new size. 0: do not. Default: 0.
    int preallocate_side = 0;
  };

  // A decoder on CUDA device `device` for batches of up to `max_batch` images (>= 1), with
  // the process's nvJPEG (NvJpegLibrary::Load: FAILED_PRECONDITION with its message when
  // there is none). INVALID_ARGUMENT for a bad device or max_batch; nvJPEG and CUDA errors
  // as NvJpegStatus / CudaStatus give them.
  static absl::StatusOr<GpuJpegDecoder> Create(int device, int max_batch);
  static absl::StatusOr<GpuJpegDecoder> Create(int device, int max_batch, const Options& options);
  // With a given library, which must outlive the decoder.
  static absl::StatusOr<GpuJpegDecoder> Create(const NvJpegLibrary& library, int device,
                                               int max_batch, const Options& options);

  GpuJpegDecoder(GpuJpegDecoder&&) noexcept;
  GpuJpegDecoder& operator=(GpuJpegDecoder&&) noexcept;
  GpuJpegDecoder(const GpuJpegDecoder&) = delete;
  GpuJpegDecoder& operator=(const GpuJpegDecoder&) = delete;
  ~GpuJpegDecoder();

  int device() const;
  int max_batch() const;
  Backend backend() const;
  // Whether chroma upsampling interpolates (Options::interpolate_chroma, where supported).
  bool interpolates_chroma() const;
  // nvjpegGetHardwareDecoderInfo: engines and cores per engine; 0 when not reported.
  int hardware_engines() const;
  int hardware_cores_per_engine() const;
  // nvJPEG's version, e.g. "13.0.1".
  absl::string_view library_version() const;

  // Whether this decoder takes `jpeg`, and its size: ClassifyForGpuDecode with
  // Options::limits, then, on the hardware backend, nvjpegDecodeBatchedSupported
  // (kDecoderRefused when the engine refuses, or reads another frame size than the header
  // rules did; kCorrupt when nvJPEG cannot parse the header). Host work only.
  GpuJpegVerdict Probe(absl::Span<const uint8_t> jpeg);

  struct Impl;

  // Probe for another thread: a header parse of its own on this decoder's nvJPEG handle, so
  // that one thread probes the next batch's files while another decodes this one. Used by
  // one thread at a time; the decoder (or what it was moved to) must outlive it.
  class Prober {
   public:
    Prober(Prober&& other) noexcept;
    Prober& operator=(Prober&& other) noexcept;
    Prober(const Prober&) = delete;
    Prober& operator=(const Prober&) = delete;
    ~Prober();
    // GpuJpegDecoder::Probe's verdict.
    GpuJpegVerdict Probe(absl::Span<const uint8_t> jpeg);

   private:
    friend class GpuJpegDecoder;
    Prober(const Impl* decoder, nvjpeg::nvjpegJpegStream* parse);
    const Impl* decoder_ = nullptr;
    nvjpeg::nvjpegJpegStream* parse_ = nullptr;
  };
  // nvJPEG errors as NvJpegStatus gives them.
  absl::StatusOr<Prober> MakeProber() const;

  // Where one image goes: `bytes` of device memory on this decoder's device, rows of
  // width * 3 bytes `pitch` bytes apart.
  struct Target {
    uint8_t* data = nullptr;
    size_t pitch = 0;
    size_t bytes = 0;
  };

  // Decodes jpegs[i] into targets[i] in `stream`'s order (a stream of this decoder's
  // device; null is the legacy default stream): the decode starts after the work enqueued
  // on `stream` before, and work enqueued after sees the pixels. On the CUDA backend it is
  // enqueued and the call returns without waiting for the GPU. On the hardware backend the
  // engines keep no stream order, so the call waits for `stream`'s earlier work, decodes,
  // and returns once the pixels are written: give it a stream of its own, so that it does
  // not wait for unrelated copies.
  // verdicts[i] is Probe's verdict on jpegs[i], whose bytes have not changed since: the
  // call reads each image's size and subsampling from it instead of parsing the file again.
  // Before any GPU work: INVALID_ARGUMENT when the spans differ in size, the batch is empty
  // or over max_batch, a verdict refuses its image (naming its index and reason), or a
  // target is null or too small for its verdict's width and height. From nvJPEG
  // (NvJpegStatus): corrupt data
  // nvJPEG finds while decoding fails the whole batch (nvJPEG reports no per-image result),
  // the targets' contents are then undefined, and the caller decodes that batch's images
  // on the CPU; the decoder stays usable.
  absl::Status DecodeBatch(absl::Span<const absl::Span<const uint8_t>> jpegs,
                           absl::Span<const GpuJpegVerdict> verdicts,
                           absl::Span<const Target> targets, CUstream_st* stream);

  // What the DecodeBatch calls so far have cost, as the calling thread saw it. A batch is
  // decoded in one group per chroma subsampling it holds: one nvjpegDecodeBatched each, on
  // a decode state of that subsampling's own, initialised again only when its group's size
  // changes.
  struct CallStats {
    int64_t batches = 0;
    int64_t groups = 0;           // nvjpegDecodeBatched calls
    int64_t initializations = 0;  // nvjpegDecodeBatchedInitialize calls
    double initialize_seconds = 0;
    int64_t drains = 0;         // waits for the stream: before a batch's groups and after them
    double drain_seconds = 0;   // in those waits (hardware backend)
    double decode_seconds = 0;  // inside nvjpegDecodeBatched
  };
  const CallStats& stats() const;

 private:
  explicit GpuJpegDecoder(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;  // null only when moved from
};

}  // namespace ferry

#endif  // FERRY_SERVER_GPU_JPEG_GPU_JPEG_DECODER_H_
