#include "server/decode/image_transform.h"

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <utility>

// jpeglib.h needs FILE and size_t declared first.
#include <jerror.h>
#include <jpeglib.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/decode/exif.h"
#include "server/decode/internal/png.h"
#include "server/decode/internal/resample.h"

namespace ferry {

using decode_internal::AxisFilter;
using decode_internal::ComputeAxisFilter;
using decode_internal::DecodePngRgb;
using decode_internal::kRowPadding;
using decode_internal::ResampleColumns;
using decode_internal::ResampleRow;

namespace {

// Caps libjpeg's whole-image buffers (progressive and multi-scan JPEGs keep every DCT
// coefficient): a corrupt or hostile header claiming 65500 x 65500 then fails cleanly instead
// of allocating (and zero-filling) gigabytes per worker thread.
constexpr long kMaxDecoderMemory = 1L << 30;  // NOLINT(runtime/int): libjpeg's type.

constexpr int kMaxOutputSize = 16384;
constexpr int kRowsPerRead = 16;
// Whole-image scratch (PNG, turned JPEG) larger than this is freed after the image, so that
// one huge file does not pin its size in every worker thread's decoder.
constexpr size_t kMaxKeptScratchBytes = 16 << 20;

constexpr uint8_t kJpegSignature[] = {0xFF, 0xD8, 0xFF};
constexpr uint8_t kPngSignature[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

bool HasPrefix(absl::Span<const uint8_t> bytes, absl::Span<const uint8_t> prefix) {
  return bytes.size() >= prefix.size() &&
         std::memcmp(bytes.data(), prefix.data(), prefix.size()) == 0;
}

bool HasPrefix(absl::Span<const uint8_t> bytes, size_t offset, const char* prefix) {
  const size_t n = std::strlen(prefix);
  return bytes.size() >= offset + n && std::memcmp(bytes.data() + offset, prefix, n) == 0;
}

// Names what a file that is neither JPEG nor PNG seems to be, by signature, without quoting
// any of its bytes.
std::string NotJpegOrPng(absl::Span<const uint8_t> bytes) {
  const char* what = nullptr;
  if (HasPrefix(bytes, 0, "GIF87a") || HasPrefix(bytes, 0, "GIF89a")) {
    what = "a GIF";
  } else if (HasPrefix(bytes, 0, "RIFF") && HasPrefix(bytes, 8, "WEBP")) {
    what = "a WebP";
  } else if (HasPrefix(bytes, 0, "BM")) {
    what = "a BMP";
  } else if (HasPrefix(bytes, 0, "II*") ||
             (HasPrefix(bytes, 0, "MM") && bytes.size() >= 4 && bytes[2] == 0 && bytes[3] == 42)) {
    what = "a TIFF";
  } else if (HasPrefix(bytes, 4, "ftyp")) {
    what = "an ISO media file (HEIF, AVIF, MP4)";
  } else if (std::all_of(bytes.begin(), bytes.begin() + std::min<size_t>(bytes.size(), 16),
                         [](uint8_t c) {
                           return (c >= 0x20 && c < 0x7F) || c == '\t' || c == '\n' || c == '\r';
                         })) {
    what = "text";
  }
  return absl::StrCat(
      "not a JPEG or PNG: it starts with neither FF D8 FF (JPEG) nor 89 50 4E 47 0D 0A 1A 0A "
      "(PNG)",
      what != nullptr ? absl::StrCat("; it looks like ", what) : "",
      "; ferry decodes JPEG and PNG by content, whatever the file name");
}

// The checks every decode starts with: not empty, not over max_sample_bytes, JPEG or PNG.
absl::StatusOr<ImageFormat> CheckInput(absl::Span<const uint8_t> bytes,
                                       const DecodeLimits& limits) {
  if (bytes.empty()) {
    return absl::InvalidArgumentError("cannot decode image: empty input (0 bytes)");
  }
  if (limits.max_sample_bytes > 0 && bytes.size() > limits.max_sample_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("refused: ", bytes.size(),
                                                   " bytes, over decode_limits.max_sample_bytes (",
                                                   limits.max_sample_bytes, ")"));
  }
  const ImageFormat format = SniffImageFormat(bytes);
  if (format == ImageFormat::kUnknown) return absl::InvalidArgumentError(NotJpegOrPng(bytes));
  return format;
}

void ReleaseIfLarge(std::vector<uint8_t>* buffer) {
  if (buffer->capacity() > kMaxKeptScratchBytes) {
    buffer->clear();
    buffer->shrink_to_fit();
  }
}

// Where the output comes from in an image of the size the crop was drawn on: the source
// interval [x0, x1) x [y0, y1) (full-resolution pixel units, fractional for the center crop)
// maps onto the output, and the filters may read pixels in [clamp_x0, clamp_x1) x
// [clamp_y0, clamp_y1).
}  // namespace

SourceWindow PlanSourceWindow(int width, int height, const ImageTransform& t, Rng& rng) {
  SourceWindow w;
  if (t.kind == ImageTransform::Kind::kRandomResizedCrop) {
    const CropBox box = SampleRandomResizedCrop(width, height, t, rng);
    w.x0 = box.x, w.x1 = box.x + box.width, w.y0 = box.y, w.y1 = box.y + box.height;
    // torchvision crops, then resizes the crop as an image of its own.
    w.clamp_x0 = box.x, w.clamp_x1 = box.x + box.width;
    w.clamp_y0 = box.y, w.clamp_y1 = box.y + box.height;
  } else {
    const ResizeCenterCropGeometry g = ComputeResizeCenterCrop(width, height, t);
    const double sx = static_cast<double>(width) / g.resized_width;
    const double sy = static_cast<double>(height) / g.resized_height;
    w.x0 = g.left * sx, w.x1 = (g.left + t.size) * sx;
    w.y0 = g.top * sy, w.y1 = (g.top + t.size) * sy;
    // The resize sees the whole image: filters near the crop's edges read beyond it.
    w.clamp_x0 = 0, w.clamp_x1 = width, w.clamp_y0 = 0, w.clamp_y1 = height;
  }
  w.mirror = t.flip && rng.Uniform() < 0.5;
  return w;
}

namespace {

struct ErrorManager {
  jpeg_error_mgr pub;  // First member: libjpeg sees only this part.
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void ErrorExit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  if (cinfo->err->msg_code == JERR_NO_SOI) {
    // libjpeg's text quotes the file's first two bytes; a message may reach a caller who
    // may not read the file, so it never carries the file's contents.
    std::snprintf(err->message, sizeof(err->message),
                  "Not a JPEG file: it does not start with a JPEG start-of-image marker");
  } else {
    (*cinfo->err->format_message)(cinfo, err->message);
  }
  std::longjmp(err->jump, 1);
}

// libjpeg reports premature end of data and corrupt entropy-coded data as warnings
// (level -1) and carries on, filling the rest with gray. A sample must never be gray-filled,
// so every warning is an error except the few that only concern metadata.
void EmitMessage(j_common_ptr cinfo, int msg_level) {
  if (msg_level >= 0) return;  // Trace and advisory messages.
  switch (cinfo->err->msg_code) {
    case JWRN_ADOBE_XFORM:  // Unknown Adobe transform code: libjpeg falls back sensibly.
    case JWRN_JFIF_MAJOR:   // Unknown JFIF version.
    case JWRN_BOGUS_ICC:    // ICC profile, which ferry does not apply.
      cinfo->err->num_warnings++;
      return;
    default:
      ErrorExit(cinfo);
  }
}

void SilentOutput(j_common_ptr) {}

// libjpeg calls this between passes and while it consumes the scans of a multi-scan JPEG
// (jpeg_start_decompress reads all of a progressive file's scans). A file with more scans
// than the limit is refused there, before it burns CPU on thousands of tiny scans.
struct ScanLimit {
  jpeg_progress_mgr pub;  // First member: libjpeg sees only this part.
  int max_scans = 0;
};

void CheckScanLimit(j_common_ptr cinfo) {
  if (!cinfo->is_decompressor) return;
  auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
  auto* limit = reinterpret_cast<ScanLimit*>(cinfo->progress);
  if (limit->max_scans > 0 && d->input_scan_number > limit->max_scans) {
    auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
    std::snprintf(err->message, sizeof(err->message),
                  "refused: more than %d scans (decode_limits.max_progressive_scans)",
                  limit->max_scans);
    err->pub.msg_code = 0;
    std::longjmp(err->jump, 1);
  }
}

inline uint8_t Mul255(int a, int b) { return static_cast<uint8_t>((a * b + 127) / 255); }

}  // namespace

// Owns one libjpeg decompressor plus scratch buffers, reused across images.
//
// Every libjpeg call goes through Guarded(), whose frame holds the setjmp; libjpeg's
// error_exit longjmps back there, crossing only libjpeg's C frames, so no C++ destructor is
// ever skipped. After a failure the decompressor is reset with jpeg_abort_decompress.
struct ImageDecoder::Impl {
  Impl() {
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = ErrorExit;
    err.pub.emit_message = EmitMessage;
    err.pub.output_message = SilentOutput;
    err.message[0] = '\0';
    created = Guarded([&] {
      jpeg_create_decompress(&cinfo);
      cinfo.mem->max_memory_to_use = kMaxDecoderMemory;
    });
    scan_limit.pub.progress_monitor = CheckScanLimit;
    scan_limit.max_scans = limits.max_progressive_scans;
    cinfo.progress = &scan_limit.pub;
  }
  ~Impl() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // Runs `f` (libjpeg calls only); false when libjpeg raised an error, whose text is then in
  // err.message. Kept out of line: a function calling setjmp must stay a real frame.
  template <typename F>
  [[gnu::noinline]] bool Guarded(F&& f) {
    if (setjmp(err.jump)) return false;
    f();
    return true;
  }

  // Error status for the last libjpeg failure; resets the decompressor for the next image.
  absl::Status Fail() {
    std::string message = err.message;
    if (err.pub.msg_code == JERR_NO_BACKING_STORE) {
      message =
          absl::StrCat("JPEG of ", cinfo.image_width, "x", cinfo.image_height, " needs more than ",
                       kMaxDecoderMemory >> 20, " MiB of decoder memory (", message, ")");
    }
    jpeg_abort_decompress(&cinfo);
    return absl::InvalidArgumentError(absl::StrCat("cannot decode JPEG: ", message));
  }

  // For a libjpeg call that returned less than asked without raising an error (not expected
  // with an in-memory source, which never suspends).
  absl::Status FailShort(const char* what) {
    jpeg_abort_decompress(&cinfo);
    return absl::InternalError(
        absl::StrCat("cannot decode JPEG: ", what, " returned early without an error"));
  }

  // Reads the header of `jpeg` (which passed CheckInput) and picks the output colour space.
  // On error the decompressor is already reset.
  absl::Status Begin(absl::Span<const uint8_t> jpeg) {
    if (!created) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot create a JPEG decompressor: ", err.message));
    }
    scan_limit.max_scans = limits.max_progressive_scans;
    bool ok = Guarded([&] {
      jpeg_mem_src(&cinfo, jpeg.data(), static_cast<unsigned long>(jpeg.size()));  // NOLINT
      jpeg_read_header(&cinfo, TRUE);
    });
    if (!ok) return Fail();
    const uint64_t pixels = static_cast<uint64_t>(cinfo.image_width) * cinfo.image_height;
    if (limits.max_image_pixels > 0 && pixels > limits.max_image_pixels) {
      const std::string size = absl::StrCat(cinfo.image_width, "x", cinfo.image_height);
      jpeg_abort_decompress(&cinfo);
      return absl::InvalidArgumentError(absl::StrCat(
          "refused: declares ", size, " = ", pixels,
          " pixels, over decode_limits.max_image_pixels (", limits.max_image_pixels, ")"));
    }
    cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    // libjpeg converts YCCK to CMYK; CMYK to RGB is ours (CmykToRgb).
    cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    // Adobe (Photoshop) CMYK JPEGs store inverted samples (255 = no ink).
    cmyk_inverted = cinfo.saw_Adobe_marker;
    return absl::OkStatus();
  }

  // Converts one row of n decoded CMYK pixels to RGB the way PIL does:
  // R = (255 - C) * (255 - K) / 255 with C, K as ink amounts.
  void CmykToRgb(const uint8_t* cmyk_row, int n, uint8_t* rgb_row) const {
    for (int i = 0; i < n; ++i) {
      int c = cmyk_row[4 * i], m = cmyk_row[4 * i + 1], y = cmyk_row[4 * i + 2],
          k = cmyk_row[4 * i + 3];
      if (!cmyk_inverted) {
        c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
      }
      rgb_row[3 * i] = Mul255(c, k);
      rgb_row[3 * i + 1] = Mul255(m, k);
      rgb_row[3 * i + 2] = Mul255(y, k);
    }
  }

  // Reads up to `max_rows` scanlines into `scanlines`; sets *rows_read. False on error.
  bool ReadRows(int max_rows, int* rows_read) {
    const size_t row_bytes = static_cast<size_t>(cinfo.output_width) * cinfo.output_components;
    JSAMPROW rows[kRowsPerRead];
    for (int r = 0; r < max_rows; ++r) rows[r] = scanlines.data() + r * row_bytes;
    JDIMENSION n = 0;
    bool ok = Guarded([&] { n = jpeg_read_scanlines(&cinfo, rows, max_rows); });
    *rows_read = static_cast<int>(n);
    return ok;
  }

  // Decodes all of `jpeg` into *out (width * height * 3 + `padding` bytes).
  absl::Status DecodeJpegFull(absl::Span<const uint8_t> jpeg, size_t padding,
                              std::vector<uint8_t>* out, int* width, int* height);
  // The crop-aware, DCT-scaled decode of an upright JPEG (DecodeAndTransform's fast path).
  absl::Status DecodeJpegWindow(absl::Span<const uint8_t> jpeg, const ImageTransform& t, Rng& rng,
                                absl::Span<uint8_t> out);
  // Resamples window `w` of a whole decoded image (rows of width * 3 bytes, readable
  // kRowPadding bytes past the last pixel) to size x size into `out`.
  void ResampleWhole(const uint8_t* rgb, int width, const SourceWindow& w, int size,
                     absl::Span<uint8_t> out);

  jpeg_decompress_struct cinfo{};
  ErrorManager err{};
  ScanLimit scan_limit{};
  DecodeLimits limits;
  bool created = false;
  bool cmyk = false;           // decoding to CMYK, converted to RGB row by row
  bool cmyk_inverted = false;  // Adobe convention

  // Scratch, reused across images.
  std::vector<uint8_t> scanlines;     // kRowsPerRead rows as libjpeg outputs them
  std::vector<uint8_t> rgb_row;       // one CMYK row converted to RGB
  std::vector<uint8_t> intermediate;  // horizontally resampled rows
  std::vector<int32_t> accum;
  AxisFilter filter_x, filter_y;
  std::vector<uint8_t> whole;     // a whole decoded image (PNG, or a JPEG to turn)
  std::vector<uint8_t> oriented;  // `whole` turned upright
  std::vector<uint8_t> png_rows;  // libspng's raw rows
};

absl::Status ImageDecoder::Impl::DecodeJpegFull(absl::Span<const uint8_t> jpeg, size_t padding,
                                                std::vector<uint8_t>* out, int* width,
                                                int* height) {
  FERRY_RETURN_IF_ERROR(Begin(jpeg));
  if (!Guarded([&] { jpeg_start_decompress(&cinfo); })) return Fail();
  const int w = static_cast<int>(cinfo.output_width);
  const int h = static_cast<int>(cinfo.output_height);
  const size_t stride = static_cast<size_t>(w) * 3;
  out->resize(stride * h + padding);
  if (cmyk) scanlines.resize(static_cast<size_t>(w) * 4);
  while (static_cast<int>(cinfo.output_scanline) < h) {
    const int y = static_cast<int>(cinfo.output_scanline);
    JSAMPROW row = cmyk ? scanlines.data() : out->data() + stride * y;
    JDIMENSION n = 0;
    if (!Guarded([&] { n = jpeg_read_scanlines(&cinfo, &row, 1); })) return Fail();
    if (n != 1) return FailShort("jpeg_read_scanlines");
    if (cmyk) CmykToRgb(scanlines.data(), w, out->data() + stride * y);
  }
  // Not jpeg_finish_decompress: every pixel is decoded, and whatever follows the last scan
  // (even a missing EOI marker) cannot change them.
  jpeg_abort_decompress(&cinfo);
  *width = w;
  *height = h;
  return absl::OkStatus();
}

ImageFormat SniffImageFormat(absl::Span<const uint8_t> bytes) {
  if (HasPrefix(bytes, kJpegSignature)) return ImageFormat::kJpeg;
  if (HasPrefix(bytes, kPngSignature)) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

ImageDecoder::ImageDecoder() : impl_(std::make_unique<Impl>()) {}
ImageDecoder::~ImageDecoder() = default;
ImageDecoder::ImageDecoder(ImageDecoder&&) noexcept = default;
ImageDecoder& ImageDecoder::operator=(ImageDecoder&&) noexcept = default;

void ImageDecoder::set_limits(const DecodeLimits& limits) {
  if (impl_ == nullptr) impl_ = std::make_unique<Impl>();
  impl_->limits = limits;
}

const DecodeLimits& ImageDecoder::limits() const {
  static const DecodeLimits kDefaults;
  return impl_ == nullptr ? kDefaults : impl_->limits;
}

absl::Status ImageDecoder::ReadSize(absl::Span<const uint8_t> image, int* width, int* height) {
  if (impl_ == nullptr) impl_ = std::make_unique<Impl>();
  FERRY_ASSIGN_OR_RETURN(const ImageFormat format, CheckInput(image, impl_->limits));
  if (format == ImageFormat::kPng) return decode_internal::ReadPngSize(image, width, height);
  FERRY_RETURN_IF_ERROR(impl_->Begin(image));
  *width = static_cast<int>(impl_->cinfo.image_width);
  *height = static_cast<int>(impl_->cinfo.image_height);
  jpeg_abort_decompress(&impl_->cinfo);
  return absl::OkStatus();
}

absl::Status ImageDecoder::DecodeRgb(absl::Span<const uint8_t> image, std::vector<uint8_t>* out,
                                     int* width, int* height) {
  if (impl_ == nullptr) impl_ = std::make_unique<Impl>();
  Impl& d = *impl_;
  FERRY_ASSIGN_OR_RETURN(const ImageFormat format, CheckInput(image, d.limits));
  absl::Status s = format == ImageFormat::kPng
                       ? DecodePngRgb(image, d.limits, 0, out, &d.png_rows, width, height)
                       : d.DecodeJpegFull(image, 0, out, width, height);
  ReleaseIfLarge(&d.png_rows);
  return s;
}

ImageTransform ImageTransform::RandomResizedCrop(int size, bool flip) {
  ImageTransform t;
  t.kind = Kind::kRandomResizedCrop;
  t.size = size;
  t.flip = flip;
  return t;
}

ImageTransform ImageTransform::ResizeCenterCrop(int size, int resize) {
  ImageTransform t;
  t.kind = Kind::kResizeCenterCrop;
  t.size = size;
  t.resize = resize;
  return t;
}

absl::Status ValidateTransform(const ImageTransform& t) {
  if (t.size < 1 || t.size > kMaxOutputSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("image transform size ", t.size, " is out of range; use 1..", kMaxOutputSize));
  }
  switch (t.kind) {
    case ImageTransform::Kind::kRandomResizedCrop:
      if (!(std::isfinite(t.scale_min) && std::isfinite(t.scale_max) && t.scale_min > 0 &&
            t.scale_min <= t.scale_max)) {
        return absl::InvalidArgumentError(
            absl::StrCat("RandomResizedCrop scale (", t.scale_min, ", ", t.scale_max,
                         ") is invalid; need 0 < min <= max, e.g. (0.08, 1.0)"));
      }
      if (!(std::isfinite(t.ratio_min) && std::isfinite(t.ratio_max) && t.ratio_min > 0 &&
            t.ratio_min <= t.ratio_max)) {
        return absl::InvalidArgumentError(
            absl::StrCat("RandomResizedCrop ratio (", t.ratio_min, ", ", t.ratio_max,
                         ") is invalid; need 0 < min <= max, e.g. (0.75, 1.3333)"));
      }
      return absl::OkStatus();
    case ImageTransform::Kind::kResizeCenterCrop:
      if (t.resize < t.size || t.resize > kMaxOutputSize) {
        return absl::InvalidArgumentError(
            absl::StrCat("Resize ", t.resize, " + CenterCrop ", t.size,
                         " is invalid; resize must be in [size, ", kMaxOutputSize, "]"));
      }
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown image transform kind ", static_cast<int>(t.kind)));
}

CropBox SampleRandomResizedCrop(int width, int height, const ImageTransform& t, Rng& rng) {
  const double area = static_cast<double>(width) * height;
  const double log_ratio_min = std::log(t.ratio_min);
  const double log_ratio_max = std::log(t.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.Uniform(t.scale_min, t.scale_max);
    const double aspect_ratio = std::exp(rng.Uniform(log_ratio_min, log_ratio_max));
    // Python's round(): halves to even, which nearbyint does in the default rounding mode.
    const double w = std::nearbyint(std::sqrt(target_area * aspect_ratio));
    const double h = std::nearbyint(std::sqrt(target_area / aspect_ratio));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      CropBox box;
      box.width = static_cast<int>(w);
      box.height = static_cast<int>(h);
      box.y = static_cast<int>(rng.Below(static_cast<uint64_t>(height - box.height) + 1));
      box.x = static_cast<int>(rng.Below(static_cast<uint64_t>(width - box.width) + 1));
      return box;
    }
  }
  // Fallback: central crop with the aspect ratio clamped into [ratio_min, ratio_max].
  CropBox box;
  const double in_ratio = static_cast<double>(width) / height;
  if (in_ratio < t.ratio_min) {
    box.width = width;
    box.height = static_cast<int>(std::nearbyint(width / t.ratio_min));
  } else if (in_ratio > t.ratio_max) {
    box.height = height;
    box.width = static_cast<int>(std::nearbyint(height * t.ratio_max));
  } else {
    box.width = width;
    box.height = height;
  }
  // torchvision can produce a 0-pixel side here only for absurd ratio ranges; keep >= 1.
  box.width = std::clamp(box.width, 1, std::max(width, 1));
  box.height = std::clamp(box.height, 1, std::max(height, 1));
  box.y = (height - box.height) / 2;
  box.x = (width - box.width) / 2;
  return box;
}

ResizeCenterCropGeometry ComputeResizeCenterCrop(int width, int height, const ImageTransform& t) {
  ResizeCenterCropGeometry g;
  const int64_t short_side = std::min(width, height);
  const int64_t long_side = std::max(width, height);
  // int(resize * long / short) in Python truncates the float quotient.
  const int new_long = static_cast<int>(static_cast<double>(t.resize) * long_side / short_side);
  if (width <= height) {
    g.resized_width = t.resize;
    g.resized_height = new_long;
  } else {
    g.resized_width = new_long;
    g.resized_height = t.resize;
  }
  g.left = static_cast<int>(std::nearbyint((g.resized_width - t.size) / 2.0));
  g.top = static_cast<int>(std::nearbyint((g.resized_height - t.size) / 2.0));
  return g;
}

void ResizeBilinearAntialias(const uint8_t* src, int src_w, int src_h, int src_stride,
                             const CropBox& box, uint8_t* dst, int out_w, int out_h) {
  AxisFilter fx, fy;
  ComputeAxisFilter(box.x, box.x + box.width, box.x, box.x + box.width, out_w, &fx);
  ComputeAxisFilter(box.y, box.y + box.height, box.y, box.y + box.height, out_h, &fy);
  const size_t row_bytes = static_cast<size_t>(out_w) * 3;
  std::vector<uint8_t> intermediate(row_bytes * (fy.end - fy.begin));
  // ResampleRow may read a little past the pixels it uses; the caller's image may end
  // right there, so each row goes through a padded copy.
  const size_t used_bytes = static_cast<size_t>(fx.end - fx.begin) * 3;
  std::vector<uint8_t> padded(used_bytes + kRowPadding);
  for (int y = fy.begin; y < fy.end; ++y) {
    std::memcpy(padded.data(), src + static_cast<size_t>(y) * src_stride + fx.begin * 3,
                used_bytes);
    ResampleRow(padded.data(), fx.begin, fx, /*mirror=*/false,
                intermediate.data() + row_bytes * (y - fy.begin));
  }
  std::vector<int32_t> accum(row_bytes);
  ResampleColumns(intermediate.data(), row_bytes, fy.begin, fy, static_cast<int>(row_bytes), dst,
                  row_bytes, accum.data());
}

int JpegDctScale(const SourceWindow& window, const ImageTransform& t) {
  // PIL's draft mode picks the scale the same way. Only n = 1, 2, 4, 8: libjpeg-turbo has
  // SIMD IDCTs for those, while 3/8, 5/8, 6/8 and 7/8 run plain-C IDCTs (6x6, 12x12, ...)
  // that cost at least what the smaller decode saves.
  for (int n = std::max(1, t.smallest_dct_scale); n < 8 && !t.full_decode; n *= 2) {
    if ((window.x1 - window.x0) * n >= 8.0 * t.size &&
        (window.y1 - window.y0) * n >= 8.0 * t.size) {
      return n;
    }
  }
  return 8;
}

absl::Status ImageDecoder::Impl::DecodeJpegWindow(absl::Span<const uint8_t> jpeg,
                                                  const ImageTransform& t, Rng& rng,
                                                  absl::Span<uint8_t> out) {
  Impl& d = *this;
  const size_t out_row_bytes = static_cast<size_t>(t.size) * 3;
  FERRY_RETURN_IF_ERROR(d.Begin(jpeg));
  const int width = static_cast<int>(d.cinfo.image_width);
  const int height = static_cast<int>(d.cinfo.image_height);
  const SourceWindow win = PlanSourceWindow(width, height, t, rng);
  const double x0 = win.x0, x1 = win.x1, y0 = win.y0, y1 = win.y1;
  const int clamp_x0 = win.clamp_x0, clamp_x1 = win.clamp_x1;
  const int clamp_y0 = win.clamp_y0, clamp_y1 = win.clamp_y1;
  const bool mirror = win.mirror;

  const int scale_num = JpegDctScale(win, t);
  d.cinfo.scale_num = static_cast<unsigned int>(scale_num);
  d.cinfo.scale_denom = 8;
  if (!d.Guarded([&] { jpeg_calc_output_dimensions(&d.cinfo); })) return d.Fail();
  const int scaled_w = static_cast<int>(d.cinfo.output_width);
  const int scaled_h = static_cast<int>(d.cinfo.output_height);

  // Scaled pixel u covers full-resolution [u, u + 1) * 8 / n, so coordinates scale by n/8.
  const double s = scale_num / 8.0;
  auto scaled_lo = [&](int v) { return static_cast<int>(std::floor(v * s)); };
  auto scaled_hi = [&](int v, int limit) {
    return std::min(static_cast<int>(std::ceil(v * s)), limit);
  };
  ComputeAxisFilter(x0 * s, x1 * s, scaled_lo(clamp_x0), scaled_hi(clamp_x1, scaled_w), t.size,
                    &d.filter_x);
  ComputeAxisFilter(y0 * s, y1 * s, scaled_lo(clamp_y0), scaled_hi(clamp_y1, scaled_h), t.size,
                    &d.filter_y);
  const AxisFilter& fx = d.filter_x;
  const AxisFilter& fy = d.filter_y;

  if (!d.Guarded([&] { jpeg_start_decompress(&d.cinfo); })) return d.Fail();

  // Decode only the columns the filters read. One spare column each side keeps libjpeg's
  // chroma upsampling at the cut identical to a full-width decode.
  JDIMENSION col0 = 0;
  if (fx.begin > 0 || fx.end < scaled_w) {
    col0 = static_cast<JDIMENSION>(std::max(fx.begin - 1, 0));
    JDIMENSION cols = static_cast<JDIMENSION>(std::min(fx.end + 1, scaled_w)) - col0;
    // Widens [col0, col0 + cols) to iMCU boundaries.
    if (!d.Guarded([&] { jpeg_crop_scanline(&d.cinfo, &col0, &cols); })) return d.Fail();
  }
  if (fy.begin > 0) {
    JDIMENSION skipped = 0;
    if (!d.Guarded(
            [&] { skipped = jpeg_skip_scanlines(&d.cinfo, static_cast<JDIMENSION>(fy.begin)); })) {
      return d.Fail();
    }
    if (skipped != static_cast<JDIMENSION>(fy.begin)) return d.FailShort("jpeg_skip_scanlines");
  }

  const int components = d.cinfo.output_components;
  const size_t scan_bytes = static_cast<size_t>(d.cinfo.output_width) * components;
  d.scanlines.resize(scan_bytes * kRowsPerRead + kRowPadding);
  if (d.cmyk) d.rgb_row.resize(static_cast<size_t>(d.cinfo.output_width) * 3 + kRowPadding);
  d.intermediate.resize(out_row_bytes * (fy.end - fy.begin));
  const int src_x0 = static_cast<int>(col0);
  int y = fy.begin;
  while (y < fy.end) {
    int got = 0;
    if (!d.ReadRows(std::min(kRowsPerRead, fy.end - y), &got)) return d.Fail();
    if (got <= 0) return d.FailShort("jpeg_read_scanlines");
    for (int r = 0; r < got; ++r, ++y) {
      const uint8_t* row = d.scanlines.data() + scan_bytes * r;
      if (d.cmyk) {
        d.CmykToRgb(row, static_cast<int>(d.cinfo.output_width), d.rgb_row.data());
        row = d.rgb_row.data();
      }
      ResampleRow(row, src_x0, fx, mirror, d.intermediate.data() + out_row_bytes * (y - fy.begin));
    }
  }
  // The rows below the crop are never decoded (see the header).
  jpeg_abort_decompress(&d.cinfo);

  d.accum.resize(out_row_bytes);
  ResampleColumns(d.intermediate.data(), out_row_bytes, fy.begin, fy,
                  static_cast<int>(out_row_bytes), out.data(), out_row_bytes, d.accum.data());
  return absl::OkStatus();
}

void ImageDecoder::Impl::ResampleWhole(const uint8_t* rgb, int width, const SourceWindow& w,
                                       int size, absl::Span<uint8_t> out) {
  // The JPEG path's resampling at DCT scale 8/8: the same filters, so a PNG and a JPEG with
  // the same pixels give the same output.
  const size_t row_bytes = static_cast<size_t>(width) * 3;
  const size_t out_row_bytes = static_cast<size_t>(size) * 3;
  ComputeAxisFilter(w.x0, w.x1, w.clamp_x0, w.clamp_x1, size, &filter_x);
  ComputeAxisFilter(w.y0, w.y1, w.clamp_y0, w.clamp_y1, size, &filter_y);
  const AxisFilter& fy = filter_y;
  intermediate.resize(out_row_bytes * (fy.end - fy.begin));
  for (int y = fy.begin; y < fy.end; ++y) {
    ResampleRow(rgb + row_bytes * y, 0, filter_x, w.mirror,
                intermediate.data() + out_row_bytes * (y - fy.begin));
  }
  accum.resize(out_row_bytes);
  ResampleColumns(intermediate.data(), out_row_bytes, fy.begin, fy, static_cast<int>(out_row_bytes),
                  out.data(), out_row_bytes, accum.data());
}

void ResampleWindow(const uint8_t* rgb, int width, int height, const SourceWindow& window, int size,
                    uint8_t* out) {
  // ResampleRow may read kRowPadding bytes past a row's last pixel: a padded copy.
  std::vector<uint8_t> padded(static_cast<size_t>(width) * height * 3 + kRowPadding);
  std::memcpy(padded.data(), rgb, padded.size() - kRowPadding);
  ImageDecoder::Impl impl;
  impl.ResampleWhole(padded.data(), width, window, size,
                     absl::MakeSpan(out, static_cast<size_t>(size) * size * 3));
}

absl::Status DecodeAndTransform(ImageDecoder& decoder, absl::Span<const uint8_t> image,
                                const ImageTransform& t, Rng& rng, absl::Span<uint8_t> out) {
  FERRY_RETURN_IF_ERROR(ValidateTransform(t));
  const size_t out_row_bytes = static_cast<size_t>(t.size) * 3;
  if (out.size() != out_row_bytes * t.size) {
    return absl::InvalidArgumentError(absl::StrCat("output buffer holds ", out.size(), " bytes; a ",
                                                   t.size, "x", t.size, " RGB image needs ",
                                                   out_row_bytes * t.size));
  }
  if (decoder.impl_ == nullptr) decoder.impl_ = std::make_unique<ImageDecoder::Impl>();
  ImageDecoder::Impl& d = *decoder.impl_;
  FERRY_ASSIGN_OR_RETURN(const ImageFormat format, CheckInput(image, d.limits));
  int orientation = 1;
  if (t.exif_orientation) {
    orientation = ParseExifOrientation(format == ImageFormat::kJpeg ? FindJpegExif(image)
                                                                    : FindPngExif(image));
  }
  if (format == ImageFormat::kJpeg && orientation == 1) {
    return d.DecodeJpegWindow(image, t, rng, out);
  }

  // Whole-image path. ResampleRow may read kRowPadding bytes past a row's last pixel.
  int width = 0, height = 0;
  absl::Status decoded =
      format == ImageFormat::kPng
          ? DecodePngRgb(image, d.limits, kRowPadding, &d.whole, &d.png_rows, &width, &height)
          : d.DecodeJpegFull(image, kRowPadding, &d.whole, &width, &height);
  ReleaseIfLarge(&d.png_rows);
  if (!decoded.ok()) {
    ReleaseIfLarge(&d.whole);
    return decoded;
  }
  const uint8_t* pixels = d.whole.data();
  if (orientation != 1) {
    int upright_width = 0, upright_height = 0;
    OrientedSize(orientation, width, height, &upright_width, &upright_height);
    d.oriented.resize(static_cast<size_t>(width) * height * 3 + kRowPadding);
    ApplyExifOrientation(orientation, d.whole.data(), width, height, d.oriented.data());
    pixels = d.oriented.data();
    width = upright_width;
    height = upright_height;
  }
  d.ResampleWhole(pixels, width, PlanSourceWindow(width, height, t, rng), t.size, out);
  ReleaseIfLarge(&d.whole);
  ReleaseIfLarge(&d.oriented);
  return absl::OkStatus();
}

}  // namespace ferry
