#include "testing/png_writer.h"

#include <spng.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ferry::testutil {
namespace {

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "ferry::testutil: %s\n", message.c_str());
  std::abort();
}

void Check(int err, const char* what) {
  if (err != 0) Die(std::string(what) + ": " + spng_strerror(err));
}

uint32_t Crc32(const uint8_t* data, size_t n, uint32_t crc = 0) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= data[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

void PutBigEndian32(uint32_t v, std::vector<uint8_t>* out) {
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<uint8_t>(v >> shift));
}

}  // namespace

int PngChannels(int color_type) {
  switch (color_type) {
    case kPngGray:
    case kPngPalette:
      return 1;
    case kPngGrayAlpha:
      return 2;
    case kPngRgb:
      return 3;
    case kPngRgba:
      return 4;
  }
  Die("unknown PNG colour type " + std::to_string(color_type));
}

std::vector<uint8_t> EncodePng(const std::vector<uint16_t>& samples, int width, int height,
                               const PngEncodeOptions& options) {
  const int channels = PngChannels(options.color_type);
  const int depth = options.bit_depth;
  if (width <= 0 || height <= 0 ||
      samples.size() != static_cast<size_t>(width) * height * channels) {
    Die("EncodePng: samples do not match the size");
  }
  // libspng's SPNG_FMT_PNG layout: the file's own, 16-bit samples host-endian, sub-byte
  // samples packed from the most significant bit.
  const size_t row_bytes = (static_cast<size_t>(width) * channels * depth + 7) / 8;
  std::vector<uint8_t> image(row_bytes * height, 0);
  for (int y = 0; y < height; ++y) {
    uint8_t* row = image.data() + row_bytes * y;
    for (int i = 0; i < width * channels; ++i) {
      const uint16_t v = samples[static_cast<size_t>(y) * width * channels + i];
      if (depth < 16 && v >> depth != 0) Die("EncodePng: sample out of range for the depth");
      if (depth == 16) {
        std::memcpy(row + 2 * i, &v, 2);
      } else {
        const size_t bit = static_cast<size_t>(i) * depth;
        row[bit / 8] |= static_cast<uint8_t>(v << (8 - depth - bit % 8));
      }
    }
  }

  spng_ctx* ctx = spng_ctx_new(SPNG_CTX_ENCODER);
  if (ctx == nullptr) Die("spng_ctx_new failed");
  Check(spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1), "SPNG_ENCODE_TO_BUFFER");
  spng_ihdr ihdr{};
  ihdr.width = static_cast<uint32_t>(width);
  ihdr.height = static_cast<uint32_t>(height);
  ihdr.bit_depth = static_cast<uint8_t>(depth);
  ihdr.color_type = static_cast<uint8_t>(options.color_type);
  ihdr.interlace_method = options.interlaced ? SPNG_INTERLACE_ADAM7 : SPNG_INTERLACE_NONE;
  Check(spng_set_ihdr(ctx, &ihdr), "spng_set_ihdr");
  if (!options.palette.empty()) {
    spng_plte plte{};
    plte.n_entries = static_cast<uint32_t>(options.palette.size());
    for (size_t i = 0; i < options.palette.size(); ++i) {
      plte.entries[i].red = options.palette[i][0];
      plte.entries[i].green = options.palette[i][1];
      plte.entries[i].blue = options.palette[i][2];
      plte.entries[i].alpha = 255;
    }
    Check(spng_set_plte(ctx, &plte), "spng_set_plte");
  }
  if (!options.exif.empty()) {
    spng_exif exif{};
    exif.length = options.exif.size();
    exif.data = reinterpret_cast<char*>(const_cast<uint8_t*>(options.exif.data()));
    Check(spng_set_exif(ctx, &exif), "spng_set_exif");
  }
  Check(spng_encode_image(ctx, image.data(), image.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE),
        "spng_encode_image");
  size_t size = 0;
  int err = 0;
  void* buffer = spng_get_png_buffer(ctx, &size, &err);
  Check(err, "spng_get_png_buffer");
  std::vector<uint8_t> png(static_cast<uint8_t*>(buffer), static_cast<uint8_t*>(buffer) + size);
  std::free(buffer);
  spng_ctx_free(ctx);
  // tRNS as given, whatever libspng would accept: tests use it to check it is ignored.
  if (!options.trns.empty()) png = AddPngChunk(png, "tRNS", options.trns, "IDAT");
  return png;
}

size_t FindPngChunk(const std::vector<uint8_t>& png, const std::string& type) {
  size_t pos = 8;
  while (pos + 8 <= png.size()) {
    const uint32_t length = (uint32_t{png[pos]} << 24) | (uint32_t{png[pos + 1]} << 16) |
                            (uint32_t{png[pos + 2]} << 8) | png[pos + 3];
    if (std::memcmp(png.data() + pos + 4, type.data(), 4) == 0) return pos;
    pos += 12 + size_t{length};
  }
  Die("FindPngChunk: no " + type + " chunk");
}

std::vector<uint8_t> AddPngChunk(const std::vector<uint8_t>& png, const std::string& type,
                                 const std::vector<uint8_t>& data, const std::string& before) {
  if (type.size() != 4) Die("AddPngChunk: a chunk type has 4 letters");
  const size_t at = FindPngChunk(png, before);
  std::vector<uint8_t> chunk;
  PutBigEndian32(static_cast<uint32_t>(data.size()), &chunk);
  chunk.insert(chunk.end(), type.begin(), type.end());
  chunk.insert(chunk.end(), data.begin(), data.end());
  PutBigEndian32(Crc32(chunk.data() + 4, chunk.size() - 4), &chunk);
  std::vector<uint8_t> out(png.begin(), png.begin() + at);
  out.insert(out.end(), chunk.begin(), chunk.end());
  out.insert(out.end(), png.begin() + at, png.end());
  return out;
}

std::vector<uint8_t> ExifWithOrientation(int value, bool big_endian, int type) {
  std::vector<uint8_t> tiff;
  auto put16 = [&](uint32_t v) {
    if (big_endian) {
      tiff.push_back(static_cast<uint8_t>(v >> 8));
      tiff.push_back(static_cast<uint8_t>(v));
    } else {
      tiff.push_back(static_cast<uint8_t>(v));
      tiff.push_back(static_cast<uint8_t>(v >> 8));
    }
  };
  auto put32 = [&](uint32_t v) {
    if (big_endian) {
      put16(v >> 16);
      put16(v & 0xFFFF);
    } else {
      put16(v & 0xFFFF);
      put16(v >> 16);
    }
  };
  tiff.push_back(big_endian ? 'M' : 'I');
  tiff.push_back(big_endian ? 'M' : 'I');
  put16(42);
  put32(8);  // IFD0 right after the header
  put16(1);  // one entry
  put16(0x0112);
  put16(static_cast<uint32_t>(type));
  put32(1);
  if (type == 3 || type == 8) {  // SHORT, SSHORT: the value in the first 2 of 4 bytes
    put16(static_cast<uint32_t>(value));
    put16(0);
  } else {
    put32(static_cast<uint32_t>(value));
  }
  put32(0);  // no next IFD
  return tiff;
}

std::vector<uint8_t> AddJpegExif(const std::vector<uint8_t>& jpeg,
                                 const std::vector<uint8_t>& tiff) {
  if (jpeg.size() < 2 || jpeg[0] != 0xFF || jpeg[1] != 0xD8) Die("AddJpegExif: not a JPEG");
  const size_t length = 2 + 6 + tiff.size();
  if (length > 0xFFFF) Die("AddJpegExif: EXIF block too large for one segment");
  std::vector<uint8_t> out = {0xFF,
                              0xD8,
                              0xFF,
                              0xE1,
                              static_cast<uint8_t>(length >> 8),
                              static_cast<uint8_t>(length),
                              'E',
                              'x',
                              'i',
                              'f',
                              0,
                              0};
  out.insert(out.end(), tiff.begin(), tiff.end());
  out.insert(out.end(), jpeg.begin() + 2, jpeg.end());
  return out;
}

}  // namespace ferry::testutil
