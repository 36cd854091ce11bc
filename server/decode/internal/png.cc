#include "server/decode/internal/png.h"

#include <spng.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace ferry::decode_internal {
namespace {

// Decompressed ancillary chunks (text, ICC profiles) are capped so that a zTXt bomb cannot
// take memory: one chunk at most kMaxChunkBytes, all of them kMaxChunkCacheBytes. PIL's own
// caps are lower (1 MiB per text chunk, 64 MiB in all).
constexpr size_t kMaxChunkBytes = 16 << 20;
constexpr size_t kMaxChunkCacheBytes = 64 << 20;
// The last line when decode_limits.max_image_pixels is off: the RGB image plus the raw rows
// of an interlaced file (up to 8 bytes per pixel) may not exceed this.
constexpr uint64_t kMaxDecodeBytes = uint64_t{4} << 30;

struct SpngCtxFree {
  void operator()(spng_ctx* ctx) const { spng_ctx_free(ctx); }
};
using SpngCtx = std::unique_ptr<spng_ctx, SpngCtxFree>;

absl::Status SpngError(int err) {
  return absl::InvalidArgumentError(absl::StrCat("cannot decode PNG: ", spng_strerror(err)));
}

// A decoder context reading `png`, with ferry's chunk limits and checksum policy. Contexts
// decode one image each (libspng's rule), so every file gets a new one.
absl::StatusOr<SpngCtx> NewContext(absl::Span<const uint8_t> png) {
  SpngCtx ctx(spng_ctx_new(0));
  if (ctx == nullptr) return absl::ResourceExhaustedError("cannot create a PNG decoder context");
  // CRC mismatch: an error in critical chunks (IHDR, PLTE, IDAT, IEND), the chunk dropped in
  // ancillary ones (libspng's and libpng's defaults, stated here because ferry relies on it).
  int err = spng_set_crc_action(ctx.get(), SPNG_CRC_ERROR, SPNG_CRC_DISCARD);
  if (err == 0) err = spng_set_chunk_limits(ctx.get(), kMaxChunkBytes, kMaxChunkCacheBytes);
  if (err == 0) err = spng_set_png_buffer(ctx.get(), png.data(), png.size());
  if (err != 0) return SpngError(err);
  return ctx;
}

// Converts one raw row (libspng's SPNG_FMT_PNG: the file's layout, 16-bit samples
// host-endian) of `width` pixels to RGB as PIL's convert("RGB") does (see png.h).
void ConvertRow(const uint8_t* raw, int width, const spng_ihdr& ihdr, const uint8_t* palette,
                uint8_t* out) {
  const int depth = ihdr.bit_depth;
  auto u16 = [raw](size_t i) {
    uint16_t v;
    std::memcpy(&v, raw + 2 * i, 2);
    return v;
  };
  switch (ihdr.color_type) {
    case SPNG_COLOR_TYPE_GRAYSCALE:
    case SPNG_COLOR_TYPE_INDEXED:
      if (depth == 16) {  // Gray only: palette indices are at most 8 bits.
        for (int x = 0; x < width; ++x, out += 3) {
          out[0] = out[1] = out[2] = static_cast<uint8_t>(std::min<uint16_t>(u16(x), 255));
        }
        return;
      }
      {
        const bool gray = ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE;
        const int mask = (1 << depth) - 1;
        const int scale = 255 / mask;  // 255, 85, 17, 1: exact for depths 1, 2, 4, 8
        for (int x = 0; x < width; ++x, out += 3) {
          const size_t bit = static_cast<size_t>(x) * depth;
          const int v = (raw[bit / 8] >> (8 - depth - bit % 8)) & mask;
          if (gray) {
            out[0] = out[1] = out[2] = static_cast<uint8_t>(v * scale);
          } else {
            std::memcpy(out, palette + 3 * v, 3);
          }
        }
      }
      return;
    case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA:
      for (int x = 0; x < width; ++x, out += 3) {
        out[0] = out[1] = out[2] = depth == 16 ? static_cast<uint8_t>(u16(2 * x) >> 8) : raw[2 * x];
      }
      return;
    case SPNG_COLOR_TYPE_TRUECOLOR:
    case SPNG_COLOR_TYPE_TRUECOLOR_ALPHA: {
      const int channels = ihdr.color_type == SPNG_COLOR_TYPE_TRUECOLOR ? 3 : 4;
      if (depth == 16) {
        for (int x = 0; x < width; ++x, out += 3) {
          for (int c = 0; c < 3; ++c) {
            out[c] = static_cast<uint8_t>(u16(static_cast<size_t>(x) * channels + c) >> 8);
          }
        }
      } else if (channels == 3) {
        std::memcpy(out, raw, static_cast<size_t>(width) * 3);
      } else {
        for (int x = 0; x < width; ++x, out += 3) std::memcpy(out, raw + 4 * x, 3);
      }
      return;
    }
  }
}

}  // namespace

absl::Status ReadPngSize(absl::Span<const uint8_t> png, int* width, int* height) {
  absl::StatusOr<SpngCtx> ctx = NewContext(png);
  if (!ctx.ok()) return ctx.status();
  spng_ihdr ihdr{};
  if (int err = spng_get_ihdr(ctx->get(), &ihdr); err != 0) return SpngError(err);
  *width = static_cast<int>(ihdr.width);
  *height = static_cast<int>(ihdr.height);
  return absl::OkStatus();
}

absl::Status DecodePngRgb(absl::Span<const uint8_t> png, const DecodeLimits& limits, size_t padding,
                          std::vector<uint8_t>* rgb, std::vector<uint8_t>* scratch, int* width,
                          int* height) {
  absl::StatusOr<SpngCtx> ctx_or = NewContext(png);
  if (!ctx_or.ok()) return ctx_or.status();
  spng_ctx* ctx = ctx_or->get();
  spng_ihdr ihdr{};
  // Reads the signature and IHDR only (libspng checks the values and IHDR's CRC).
  if (int err = spng_get_ihdr(ctx, &ihdr); err != 0) return SpngError(err);
  const uint64_t pixels = uint64_t{ihdr.width} * ihdr.height;
  if (limits.max_image_pixels > 0 && pixels > limits.max_image_pixels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "refused: declares ", ihdr.width, "x", ihdr.height, " = ", pixels,
        " pixels, over decode_limits.max_image_pixels (", limits.max_image_pixels, ")"));
  }
  size_t raw_size = 0;
  if (int err = spng_decoded_image_size(ctx, SPNG_FMT_PNG, &raw_size); err != 0) {
    return SpngError(err);
  }
  const bool interlaced = ihdr.interlace_method != SPNG_INTERLACE_NONE;
  const size_t raw_row = raw_size / ihdr.height;
  const uint64_t need = pixels * 3 + (interlaced ? raw_size : raw_row);
  if (need > kMaxDecodeBytes) {
    return absl::InvalidArgumentError(absl::StrCat("refused: PNG of ", ihdr.width, "x", ihdr.height,
                                                   " needs more than ", kMaxDecodeBytes >> 20,
                                                   " MiB to decode"));
  }

  // Reads the chunks before the image data (PLTE among them) and sets up row decoding.
  if (int err = spng_decode_image(ctx, nullptr, 0, SPNG_FMT_PNG, SPNG_DECODE_PROGRESSIVE);
      err != 0) {
    return SpngError(err);
  }
  // PIL's palette: PLTE's colours, then (i, i, i) for indices past its end.
  uint8_t palette[256 * 3];
  if (ihdr.color_type == SPNG_COLOR_TYPE_INDEXED) {
    spng_plte plte{};
    if (int err = spng_get_plte(ctx, &plte); err != 0) return SpngError(err);
    for (uint32_t i = 0; i < 256; ++i) {
      if (i < plte.n_entries) {
        palette[3 * i] = plte.entries[i].red;
        palette[3 * i + 1] = plte.entries[i].green;
        palette[3 * i + 2] = plte.entries[i].blue;
      } else {
        palette[3 * i] = palette[3 * i + 1] = palette[3 * i + 2] = static_cast<uint8_t>(i);
      }
    }
  }

  const int w = static_cast<int>(ihdr.width);
  const int h = static_cast<int>(ihdr.height);
  const size_t rgb_row = static_cast<size_t>(w) * 3;
  rgb->resize(rgb_row * h + padding);
  // Interlaced rows arrive once per pass, each filling some of the row's pixels (sub-byte
  // samples are OR-ed in, so the buffer starts zeroed); the image is converted at the end.
  scratch->assign(interlaced ? raw_size : raw_row, 0);
  int err = 0;
  do {
    spng_row_info row{};
    err = spng_get_row_info(ctx, &row);
    if (err != 0) break;
    uint8_t* raw = scratch->data() + (interlaced ? raw_row * row.row_num : 0);
    err = spng_decode_row(ctx, raw, raw_row);
    if ((err == 0 || err == SPNG_EOI) && !interlaced) {
      ConvertRow(raw, w, ihdr, palette, rgb->data() + rgb_row * row.row_num);
    }
  } while (err == 0);
  if (err != SPNG_EOI) return SpngError(err);
  // libspng stops reading when the last row is done, before the CRC that closes the image
  // data: reading on to IEND checks it (and the chunks after the image), so a damaged last
  // IDAT chunk is an error, not pixels that are silently wrong.
  if (err = spng_decode_chunks(ctx); err != 0) return SpngError(err);
  if (interlaced) {
    for (int y = 0; y < h; ++y) {
      ConvertRow(scratch->data() + raw_row * y, w, ihdr, palette, rgb->data() + rgb_row * y);
    }
  }
  *width = w;
  *height = h;
  return absl::OkStatus();
}

}  // namespace ferry::decode_internal
