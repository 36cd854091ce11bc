// What a JPEG's headers say, read by ferry's own marker parser (no libjpeg, no nvJPEG), and
// whether a GPU JPEG engine can take the file. The split between GPU and CPU decoding is
// decided per sample from this, so it must be cheap (it reads the markers up to the first
// scan and looks for the end marker, never the entropy-coded data) and it must run where
// nvJPEG does not: in CI and on hosts without a GPU.
//
//   absl::StatusOr<JpegHeader> header = ParseJpegHeader(bytes);
//   GpuJpegVerdict verdict = ClassifyForGpuDecode(bytes, limits);
//   if (verdict.reason == GpuJpegReject::kNone) { ... decode on the GPU, verdict.width ... }
//   else { ... CPU decode; count the fallback under GpuJpegRejectName(verdict.reason) ... }
//
// Thread safety: pure functions.
#ifndef FERRY_SERVER_DECODE_JPEG_HEADER_H_
#define FERRY_SERVER_DECODE_JPEG_HEADER_H_

#include <array>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ferry {

// The coding process, from the start-of-frame marker (ITU T.81, table B.1).
enum class JpegCoding {
  kBaseline,            // SOF0: Huffman, 8-bit, at most 2 Huffman tables per class
  kExtendedSequential,  // SOF1: Huffman, 8- or 12-bit, up to 4 tables per class
  kProgressive,         // SOF2
  kLossless,            // SOF3
  kHierarchical,        // SOF5..SOF7 (differential, Huffman)
  kArithmetic,          // SOF9..SOF11, SOF13..SOF15
};

// The colour space libjpeg(-turbo) decodes the components as (jdapimin.c's rules: a JFIF
// marker means YCbCr, an Adobe APP14 marker's transform flag decides, else component ids
// 'R','G','B' mean RGB).
enum class JpegColorSpace { kGray, kYCbCr, kRgb, kCmyk, kYcck, kOther };

// The chroma subsampling of a 3-component image, as nvJPEG names it
// (nvjpegChromaSubsampling_t), or kGray for one component.
enum class JpegSubsampling { k444, k422, k420, k440, k411, k410, kGray, kOther };

struct JpegComponent {
  uint8_t id = 0;
  uint8_t h = 0;  // horizontal sampling factor, 1..4
  uint8_t v = 0;  // vertical sampling factor, 1..4
};

struct JpegHeader {
  static constexpr int kMaxStoredComponents = 4;

  JpegCoding coding = JpegCoding::kBaseline;
  int precision = 8;  // bits per sample
  int width = 0;
  int height = 0;  // never 0: a frame that defers its height to a DNL marker is refused
  int num_components = 0;
  // The first min(num_components, 4) components of the frame header, in order.
  std::array<JpegComponent, kMaxStoredComponents> components{};
  int first_scan_components = 0;  // components in the first scan (SOS)
  int max_huffman_table = -1;     // highest DHT table id defined before the first scan
  int restart_interval = 0;       // DRI before the first scan, in MCUs
  bool jfif = false;              // APP0 "JFIF\0"
  int adobe_transform = -1;       // APP14 "Adobe": 0 none, 1 YCbCr, 2 YCCK; -1 no marker
  bool has_eoi = false;           // an EOI marker (FF D9) follows the first scan
  JpegColorSpace color_space = JpegColorSpace::kOther;
  JpegSubsampling subsampling = JpegSubsampling::kOther;
};

// Parses the markers from SOI to the first SOS (frame header, JFIF/Adobe markers, DHT ids,
// DRI), then looks backwards from the end for EOI. INVALID_ARGUMENT "not a JPEG: ..." or
// "corrupt JPEG header: ..." (naming the marker and offset) for data that is not a JPEG, is
// cut short before the first scan, has a malformed or duplicate frame header, a zero
// dimension, a sampling factor outside 1..4, or a first scan naming no frame component.
// A file cut short inside its entropy-coded data parses, with has_eoi false.
absl::StatusOr<JpegHeader> ParseJpegHeader(absl::Span<const uint8_t> jpeg);

// Why a JPEG goes to the CPU instead of a GPU JPEG decoder; kNone means the GPU takes it.
// The rules are those of nvJPEG's hardware engine (NVJPEG_BACKEND_HARDWARE: A100, H100 and
// later), which every nvJPEG backend also decodes: one baseline Huffman scan, 8-bit
// samples, grayscale or YCbCr 4:4:4, 4:2:2, 4:2:0 or 4:4:0.
enum class GpuJpegReject {
  kNone,
  kCorrupt,                 // header does not parse, or no EOI (cut short)
  kProgressive,             // SOF2
  kUnsupportedCoding,       // lossless, hierarchical, arithmetic, 12-bit, several scans
  kUnsupportedSubsampling,  // 4:1:1, 4:1:0 or irregular sampling factors
  kCmyk,                    // 4 components (CMYK, YCCK)
  kUnsupportedColorSpace,   // RGB stored without the YCbCr transform, 2 or 5+ components
  kTooLarge,                // over GpuJpegLimits::max_pixels
  kDecoderRefused,          // passed these rules, refused by nvJPEG's own check on the device
};
inline constexpr int kNumGpuJpegRejects = 9;

// "none", "corrupt", "progressive", "unsupported_coding", "unsupported_subsampling", "cmyk",
// "unsupported_color_space", "too_large", "decoder_refused": stable names for metrics and
// status.
absl::string_view GpuJpegRejectName(GpuJpegReject reason);

struct GpuJpegLimits {
  // width x height above which the CPU decodes (the GPU path's scratch is sized for this).
  // Default: 89478485, PIL's and DecodeLimits' default.
  uint64_t max_pixels = 89478485;
};

struct GpuJpegVerdict {
  GpuJpegReject reason = GpuJpegReject::kCorrupt;
  int width = 0;  // from the frame header when it parsed; else 0
  int height = 0;
  JpegSubsampling subsampling = JpegSubsampling::kOther;
  int num_components = 0;
};

// The decision for one file. Never fails: unparsable data is kCorrupt. Never
// kDecoderRefused: the hardware engine may still refuse a file that passes, which
// GpuJpegDecoder::Probe asks nvJPEG about on the device.
GpuJpegVerdict ClassifyForGpuDecode(absl::Span<const uint8_t> jpeg, const GpuJpegLimits& limits);
// The same decision on a header already parsed.
GpuJpegVerdict ClassifyForGpuDecode(const JpegHeader& header, const GpuJpegLimits& limits);

}  // namespace ferry

#endif  // FERRY_SERVER_DECODE_JPEG_HEADER_H_
