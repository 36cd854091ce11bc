#include "testing/jpeg_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>

#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "common/unique_fd.h"

namespace ferry::testutil {
namespace {

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "ferry::testutil: %s\n", message.c_str());
  std::abort();
}

struct ErrorManager {
  jpeg_error_mgr pub;  // First member: libjpeg sees only this part.
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void ErrorExit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void SilentOutput(j_common_ptr) {}

// Owns a compressor and its output buffer (malloc'ed by jpeg_mem_dest).
class Compressor {
 public:
  Compressor() {
    cinfo_.err = jpeg_std_error(&err_.pub);
    err_.pub.error_exit = ErrorExit;
    err_.pub.output_message = SilentOutput;
    jpeg_create_compress(&cinfo_);  // Only fails on allocation failure (then aborts below).
  }
  ~Compressor() {
    jpeg_destroy_compress(&cinfo_);
    std::free(buffer_);
  }
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;

  // Compresses `components`-channel rows. `configure` runs after jpeg_set_defaults.
  template <typename Configure>
  std::vector<uint8_t> Run(const uint8_t* pixels, int width, int height, int components,
                           J_COLOR_SPACE in_space, Configure configure) {
    if (!RunGuarded(pixels, width, height, components, in_space, configure)) {
      Die(absl::StrCat("libjpeg compression failed: ", err_.message));
    }
    return std::vector<uint8_t>(buffer_, buffer_ + size_);
  }

 private:
  // No C++ objects with destructors live in this frame, so longjmp out of libjpeg is safe.
  template <typename Configure>
  bool RunGuarded(const uint8_t* pixels, int width, int height, int components,
                  J_COLOR_SPACE in_space, Configure& configure) {
    if (setjmp(err_.jump)) {
      jpeg_abort_compress(&cinfo_);
      return false;
    }
    jpeg_mem_dest(&cinfo_, &buffer_, &size_);
    cinfo_.image_width = static_cast<JDIMENSION>(width);
    cinfo_.image_height = static_cast<JDIMENSION>(height);
    cinfo_.input_components = components;
    cinfo_.in_color_space = in_space;
    jpeg_set_defaults(&cinfo_);
    configure(&cinfo_);
    jpeg_start_compress(&cinfo_, TRUE);
    const size_t stride = static_cast<size_t>(width) * components;
    while (cinfo_.next_scanline < cinfo_.image_height) {
      JSAMPROW row = const_cast<JSAMPROW>(pixels + cinfo_.next_scanline * stride);
      jpeg_write_scanlines(&cinfo_, &row, 1);
    }
    jpeg_finish_compress(&cinfo_);
    return true;
  }

  jpeg_compress_struct cinfo_{};
  ErrorManager err_{};
  unsigned char* buffer_ = nullptr;
  unsigned long size_ = 0;  // NOLINT(runtime/int): libjpeg's type.
};

void CheckArgs(const uint8_t* pixels, int width, int height, int quality) {
  if (pixels == nullptr || width <= 0 || height <= 0 || width > JPEG_MAX_DIMENSION ||
      height > JPEG_MAX_DIMENSION || quality < 1 || quality > 100) {
    Die(absl::StrCat("invalid JPEG encode arguments: ", width, "x", height, " quality ", quality,
                     (pixels == nullptr ? " (null pixels)" : "")));
  }
}

}  // namespace

std::vector<uint8_t> EncodeJpeg(const uint8_t* rgb, int width, int height, int quality,
                                bool progressive) {
  JpegEncodeOptions options;
  options.quality = quality;
  options.progressive = progressive;
  return EncodeJpeg(rgb, width, height, options);
}

std::vector<uint8_t> EncodeJpeg(const uint8_t* rgb, int width, int height,
                                const JpegEncodeOptions& options) {
  CheckArgs(rgb, width, height, options.quality);
  Compressor compressor;
  return compressor.Run(rgb, width, height, 3, JCS_RGB, [&](j_compress_ptr cinfo) {
    jpeg_set_quality(cinfo, options.quality, TRUE);
    if (options.store_rgb) jpeg_set_colorspace(cinfo, JCS_RGB);
    int h = 2, v = 2;
    switch (options.subsampling) {
      case ChromaSubsampling::k420:
        break;
      case ChromaSubsampling::k422:
        v = 1;
        break;
      case ChromaSubsampling::k444:
        h = v = 1;
        break;
      case ChromaSubsampling::k440:
        h = 1;
        break;
      case ChromaSubsampling::k411:
        h = 4, v = 1;
        break;
    }
    cinfo->comp_info[0].h_samp_factor = h;
    cinfo->comp_info[0].v_samp_factor = v;
    for (int c = 1; c < 3; ++c) {
      cinfo->comp_info[c].h_samp_factor = 1;
      cinfo->comp_info[c].v_samp_factor = 1;
    }
    cinfo->restart_interval = static_cast<unsigned int>(options.restart_interval);
    if (options.progressive) jpeg_simple_progression(cinfo);
    if (options.scan_per_coefficient) {
      static jpeg_scan_info scans[1 + 63 * 3];
      scans[0] = jpeg_scan_info{3, {0, 1, 2, 0}, 0, 0, 0, 0};  // DC of all components
      int n = 1;
      for (int c = 0; c < 3; ++c) {
        for (int k = 1; k <= 63; ++k) scans[n++] = jpeg_scan_info{1, {c, 0, 0, 0}, k, k, 0, 0};
      }
      cinfo->scan_info = scans;
      cinfo->num_scans = n;
    }
  });
}

std::vector<uint8_t> EncodeGrayJpeg(const uint8_t* gray, int width, int height, int quality) {
  CheckArgs(gray, width, height, quality);
  Compressor compressor;
  return compressor.Run(gray, width, height, 1, JCS_GRAYSCALE,
                        [&](j_compress_ptr cinfo) { jpeg_set_quality(cinfo, quality, TRUE); });
}

std::vector<uint8_t> EncodeCmykJpeg(const uint8_t* cmyk, int width, int height, int quality) {
  CheckArgs(cmyk, width, height, quality);
  // Adobe CMYK JPEGs store 255 - ink; libjpeg writes samples as given, so invert first.
  std::vector<uint8_t> inverted(static_cast<size_t>(width) * height * 4);
  for (size_t i = 0; i < inverted.size(); ++i) inverted[i] = 255 - cmyk[i];
  Compressor compressor;
  return compressor.Run(inverted.data(), width, height, 4, JCS_CMYK, [&](j_compress_ptr cinfo) {
    jpeg_set_quality(cinfo, quality, TRUE);
    cinfo->write_Adobe_marker = TRUE;  // jpeg_set_defaults sets it for CMYK; be explicit.
  });
}

std::vector<uint8_t> MakeTestPattern(int width, int height, uint64_t seed) {
  if (width <= 0 || height <= 0) {
    Die(absl::StrCat("invalid test pattern size ", width, "x", height));
  }
  constexpr double kTwoPi = 6.283185307179586;
  Rng rng(MixSeed(seed, 0x7061747465726eull));  // "pattern"
  struct Wave {
    double fx, fy, phase, amplitude;
  };
  // Per channel: a linear gradient and two waves of 0.5..3 cycles across the image, so
  // the image has structure at every crop position yet stays smooth.
  double gx[3], gy[3];
  Wave waves[3][2];
  for (int c = 0; c < 3; ++c) {
    gx[c] = rng.Uniform(-40.0, 40.0);
    gy[c] = rng.Uniform(-40.0, 40.0);
    for (Wave& w : waves[c]) {
      w.fx = rng.Uniform(0.5, 3.0) * (rng.Uniform() < 0.5 ? -1 : 1);
      w.fy = rng.Uniform(0.5, 3.0);
      w.phase = rng.Uniform(0.0, kTwoPi);
      w.amplitude = rng.Uniform(15.0, 25.0);
    }
  }
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    const double v = (y + 0.5) / height;
    for (int x = 0; x < width; ++x) {
      const double u = (x + 0.5) / width;
      for (int c = 0; c < 3; ++c) {
        double value = 127.5 + gx[c] * (u - 0.5) + gy[c] * (v - 0.5);
        for (const Wave& w : waves[c]) {
          value += w.amplitude * std::sin(kTwoPi * (w.fx * u + w.fy * v) + w.phase);
        }
        // |gradients| <= 40 and |waves| <= 50 keep the value inside [37.5, 217.5]; the clamp
        // only documents the promised range.
        value = std::fmin(239.0, std::fmax(16.0, value));
        rgb[(static_cast<size_t>(y) * width + x) * 3 + c] =
            static_cast<uint8_t>(std::lround(value));
      }
    }
  }
  return rgb;
}

absl::Status WriteFile(const std::string& path, absl::Span<const uint8_t> bytes) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot create '", path, "'"));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot write '", path, "'"));
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd.Release()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot close '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace ferry::testutil
