#include "server/decode/jpeg_header.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

// Marker codes (the byte after 0xFF), ITU T.81 table B.1.
constexpr uint8_t kSoi = 0xD8, kEoi = 0xD9, kSos = 0xDA, kDht = 0xC4, kDac = 0xCC, kJpg = 0xC8,
                  kDri = 0xDD, kApp0 = 0xE0, kApp14 = 0xEE, kTem = 0x01;

bool IsSof(uint8_t m) { return m >= 0xC0 && m <= 0xCF && m != kDht && m != kJpg && m != kDac; }
bool IsRst(uint8_t m) { return m >= 0xD0 && m <= 0xD7; }

JpegCoding CodingOf(uint8_t sof) {
  switch (sof) {
    case 0xC0:
      return JpegCoding::kBaseline;
    case 0xC1:
      return JpegCoding::kExtendedSequential;
    case 0xC2:
      return JpegCoding::kProgressive;
    case 0xC3:
      return JpegCoding::kLossless;
    case 0xC5:
    case 0xC6:
    case 0xC7:
      return JpegCoding::kHierarchical;
    default:  // C9..CB, CD..CF
      return JpegCoding::kArithmetic;
  }
}

uint16_t Be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }

// `marker` < 0: the error is not inside a marker.
absl::Status Corrupt(absl::string_view what, int marker, size_t offset) {
  if (marker < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("corrupt JPEG header: ", what, " (at offset ", offset, ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat("corrupt JPEG header: ", what, " (marker FF",
                                                 absl::Hex(marker, absl::kZeroPad2), " at offset ",
                                                 offset, ")"));
}

// libjpeg's default_decompress_parms (jdapimin.c).
JpegColorSpace ColorSpaceOf(const JpegHeader& h) {
  switch (h.num_components) {
    case 1:
      return JpegColorSpace::kGray;
    case 3: {
      if (h.jfif) return JpegColorSpace::kYCbCr;
      if (h.adobe_transform >= 0) {
        return h.adobe_transform == 0 ? JpegColorSpace::kRgb : JpegColorSpace::kYCbCr;
      }
      const auto& c = h.components;
      if (c[0].id == 'R' && c[1].id == 'G' && c[2].id == 'B') return JpegColorSpace::kRgb;
      return JpegColorSpace::kYCbCr;
    }
    case 4:
      return h.adobe_transform == 0 || h.adobe_transform < 0 ? JpegColorSpace::kCmyk
                                                             : JpegColorSpace::kYcck;
    default:
      return JpegColorSpace::kOther;
  }
}

// nvjpegGetImageInfo's classification: chroma 1x1, luma factors give the ratio.
JpegSubsampling SubsamplingOf(const JpegHeader& h) {
  if (h.num_components == 1) return JpegSubsampling::kGray;
  if (h.num_components != 3) return JpegSubsampling::kOther;
  const auto& c = h.components;
  for (int i = 1; i < 3; ++i) {
    if (c[i].h != 1 || c[i].v != 1) return JpegSubsampling::kOther;
  }
  const int key = c[0].h * 10 + c[0].v;
  switch (key) {
    case 11:
      return JpegSubsampling::k444;
    case 21:
      return JpegSubsampling::k422;
    case 22:
      return JpegSubsampling::k420;
    case 12:
      return JpegSubsampling::k440;
    case 41:
      return JpegSubsampling::k411;
    case 42:
      return JpegSubsampling::k410;
    default:
      return JpegSubsampling::kOther;
  }
}

}  // namespace

absl::StatusOr<JpegHeader> ParseJpegHeader(absl::Span<const uint8_t> jpeg) {
  const uint8_t* b = jpeg.data();
  const size_t n = jpeg.size();
  if (n < 4 || b[0] != 0xFF || b[1] != kSoi) {
    return absl::InvalidArgumentError("not a JPEG: no SOI marker (FF D8) at the start");
  }
  JpegHeader h;
  bool have_frame = false;
  size_t pos = 2;
  while (true) {
    // A marker: 0xFF, any number of 0xFF fill bytes, then the code.
    if (pos >= n) return Corrupt("data ends before the first scan", -1, pos);
    if (b[pos] != 0xFF) return Corrupt("expected a marker", -1, pos);
    while (pos < n && b[pos] == 0xFF) ++pos;
    if (pos >= n) return Corrupt("data ends before the first scan", -1, pos);
    const uint8_t m = b[pos];
    const size_t marker_at = pos - 1;
    ++pos;
    if (m == 0x00) return Corrupt("stuffed byte outside a scan", m, marker_at);
    if (IsRst(m) || m == kTem) continue;  // no length
    if (m == kSoi) return Corrupt("second SOI", m, marker_at);
    if (m == kEoi) return Corrupt("EOI before the first scan", m, marker_at);
    if (pos + 2 > n) return Corrupt("data ends inside a marker's length", m, marker_at);
    const size_t length = Be16(b + pos);
    if (length < 2) return Corrupt("marker length under 2", m, marker_at);
    if (pos + length > n) return Corrupt("data ends inside a marker segment", m, marker_at);
    const uint8_t* seg = b + pos + 2;
    const size_t seg_len = length - 2;
    pos += length;

    if (IsSof(m)) {
      if (have_frame) return Corrupt("second frame header", m, marker_at);
      if (seg_len < 6) return Corrupt("frame header too short", m, marker_at);
      h.coding = CodingOf(m);
      h.precision = seg[0];
      h.height = Be16(seg + 1);
      h.width = Be16(seg + 3);
      h.num_components = seg[5];
      if (h.num_components == 0) return Corrupt("frame with no components", m, marker_at);
      if (seg_len != 6 + 3 * static_cast<size_t>(h.num_components)) {
        return Corrupt("frame header length does not match its component count", m, marker_at);
      }
      if (h.height == 0) {
        return Corrupt("height 0 (defined later by a DNL marker; not supported)", m, marker_at);
      }
      if (h.width == 0) return Corrupt("width 0", m, marker_at);
      for (int i = 0; i < h.num_components; ++i) {
        const uint8_t* c = seg + 6 + 3 * i;
        const int hf = c[1] >> 4, vf = c[1] & 15;
        if (hf < 1 || hf > 4 || vf < 1 || vf > 4) {
          return Corrupt(
              absl::StrCat("sampling factors ", hf, "x", vf, " of component ", i, " outside 1..4"),
              m, marker_at);
        }
        if (i < JpegHeader::kMaxStoredComponents) {
          h.components[i] = JpegComponent{c[0], static_cast<uint8_t>(hf), static_cast<uint8_t>(vf)};
        }
      }
      have_frame = true;
    } else if (m == kDht) {
      size_t p = 0;
      while (p < seg_len) {
        if (p + 17 > seg_len) return Corrupt("Huffman table cut short", m, marker_at);
        const int table_class = seg[p] >> 4, id = seg[p] & 15;
        if (table_class > 1 || id > 3)
          return Corrupt("bad Huffman table class or id", m, marker_at);
        size_t values = 0;
        for (int i = 1; i <= 16; ++i) values += seg[p + i];
        p += 17 + values;
        if (p > seg_len) return Corrupt("Huffman table cut short", m, marker_at);
        if (id > h.max_huffman_table) h.max_huffman_table = id;
      }
    } else if (m == kDri) {
      if (seg_len < 2) return Corrupt("restart interval segment too short", m, marker_at);
      h.restart_interval = Be16(seg);
    } else if (m == kApp0) {
      if (seg_len >= 5 && std::memcmp(seg, "JFIF\0", 5) == 0) h.jfif = true;
    } else if (m == kApp14) {
      // "Adobe", version (2), flags0 (2), flags1 (2), transform (1): libjpeg's APP14_DATA_LEN.
      if (seg_len >= 12 && std::memcmp(seg, "Adobe", 5) == 0) h.adobe_transform = seg[11];
    } else if (m == kSos) {
      if (!have_frame) return Corrupt("scan before the frame header", m, marker_at);
      if (seg_len < 1) return Corrupt("scan header too short", m, marker_at);
      const int ns = seg[0];
      if (ns < 1 || ns > 4 || seg_len != 4 + 2 * static_cast<size_t>(ns)) {
        return Corrupt("scan header length does not match its component count", m, marker_at);
      }
      for (int i = 0; i < ns; ++i) {
        const uint8_t selector = seg[1 + 2 * i];
        bool found = false;
        for (int c = 0; c < h.num_components && c < JpegHeader::kMaxStoredComponents; ++c) {
          found = found || h.components[c].id == selector;
        }
        if (!found) return Corrupt("scan names a component the frame lacks", m, marker_at);
      }
      h.first_scan_components = ns;
      break;
    }
    // Anything else (DQT, APPn, COM, DAC, DNL, ...) is skipped.
  }
  // Entropy-coded data holds 0xFF only before 0x00 or RSTn, so FF D9 after the scan header is
  // the end of the image (or lies in data appended after it). A complete file ends with it:
  // the backward search is one step for those, and reads the whole scan only for files cut
  // short.
  for (size_t i = n - 1; i > pos; --i) {
    if (b[i] == kEoi && b[i - 1] == 0xFF) {
      h.has_eoi = true;
      break;
    }
  }
  h.color_space = ColorSpaceOf(h);
  h.subsampling = SubsamplingOf(h);
  return h;
}

absl::string_view GpuJpegRejectName(GpuJpegReject reason) {
  switch (reason) {
    case GpuJpegReject::kNone:
      return "none";
    case GpuJpegReject::kCorrupt:
      return "corrupt";
    case GpuJpegReject::kProgressive:
      return "progressive";
    case GpuJpegReject::kUnsupportedCoding:
      return "unsupported_coding";
    case GpuJpegReject::kUnsupportedSubsampling:
      return "unsupported_subsampling";
    case GpuJpegReject::kCmyk:
      return "cmyk";
    case GpuJpegReject::kUnsupportedColorSpace:
      return "unsupported_color_space";
    case GpuJpegReject::kTooLarge:
      return "too_large";
    case GpuJpegReject::kDecoderRefused:
      return "decoder_refused";
  }
  return "unknown";
}

GpuJpegVerdict ClassifyForGpuDecode(const JpegHeader& h, const GpuJpegLimits& limits) {
  GpuJpegVerdict v;
  v.width = h.width;
  v.height = h.height;
  v.subsampling = h.subsampling;
  v.num_components = h.num_components;
  v.reason = [&] {
    if (!h.has_eoi) return GpuJpegReject::kCorrupt;
    switch (h.coding) {
      case JpegCoding::kBaseline:
      case JpegCoding::kExtendedSequential:
        break;
      case JpegCoding::kProgressive:
        return GpuJpegReject::kProgressive;
      default:
        return GpuJpegReject::kUnsupportedCoding;
    }
    // SOF1 with 8-bit samples and two Huffman tables per class is baseline in all but name.
    if (h.precision != 8 || h.max_huffman_table > 1) return GpuJpegReject::kUnsupportedCoding;
    // A sequential frame codes each component in exactly one scan: the first scan holds them
    // all, or there are several scans.
    if (h.first_scan_components != h.num_components) return GpuJpegReject::kUnsupportedCoding;
    if (h.num_components == 4) return GpuJpegReject::kCmyk;
    if (h.color_space != JpegColorSpace::kGray && h.color_space != JpegColorSpace::kYCbCr) {
      return GpuJpegReject::kUnsupportedColorSpace;
    }
    switch (h.subsampling) {
      case JpegSubsampling::k444:
      case JpegSubsampling::k422:
      case JpegSubsampling::k420:
      case JpegSubsampling::k440:
      case JpegSubsampling::kGray:
        break;
      default:
        return GpuJpegReject::kUnsupportedSubsampling;
    }
    if (static_cast<uint64_t>(h.width) * static_cast<uint64_t>(h.height) > limits.max_pixels) {
      return GpuJpegReject::kTooLarge;
    }
    return GpuJpegReject::kNone;
  }();
  return v;
}

GpuJpegVerdict ClassifyForGpuDecode(absl::Span<const uint8_t> jpeg, const GpuJpegLimits& limits) {
  absl::StatusOr<JpegHeader> header = ParseJpegHeader(jpeg);
  if (!header.ok()) return GpuJpegVerdict{};
  return ClassifyForGpuDecode(*header, limits);
}

}  // namespace ferry
