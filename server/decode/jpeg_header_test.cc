// ferry's JPEG marker parser and the GPU-or-CPU decision, on files libjpeg-turbo writes
// (testing/jpeg_writer.h) and on hand-built headers for what libjpeg's encoder never writes
// (lossless, arithmetic, 12-bit, several sequential scans, broken segments).
#include "server/decode/jpeg_header.h"

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/jpeg_writer.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using testutil::ChromaSubsampling;

std::vector<uint8_t> PatternJpeg(int w, int h, testutil::JpegEncodeOptions options) {
  const std::vector<uint8_t> rgb = testutil::MakeTestPattern(w, h, 5);
  return testutil::EncodeJpeg(rgb.data(), w, h, options);
}

std::vector<uint8_t> PatternJpeg(int w, int h, ChromaSubsampling subsampling) {
  testutil::JpegEncodeOptions options;
  options.subsampling = subsampling;
  return PatternJpeg(w, h, options);
}

JpegHeader MustParse(const std::vector<uint8_t>& jpeg) {
  absl::StatusOr<JpegHeader> h = ParseJpegHeader(jpeg);
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? *h : JpegHeader{};
}

GpuJpegReject Reason(const std::vector<uint8_t>& jpeg, GpuJpegLimits limits = {}) {
  return ClassifyForGpuDecode(jpeg, limits).reason;
}

// ---------------------------------------------------------------- files libjpeg-turbo writes

TEST(JpegHeader, Baseline420) {
  const std::vector<uint8_t> jpeg = PatternJpeg(333, 501, ChromaSubsampling::k420);
  const JpegHeader h = MustParse(jpeg);
  EXPECT_EQ(h.coding, JpegCoding::kBaseline);
  EXPECT_EQ(h.precision, 8);
  EXPECT_EQ(h.width, 333);
  EXPECT_EQ(h.height, 501);
  ASSERT_EQ(h.num_components, 3);
  EXPECT_EQ(h.components[0].id, 1);
  EXPECT_EQ(h.components[0].h, 2);
  EXPECT_EQ(h.components[0].v, 2);
  EXPECT_EQ(h.components[1].h, 1);
  EXPECT_EQ(h.components[2].v, 1);
  EXPECT_EQ(h.first_scan_components, 3);
  EXPECT_EQ(h.max_huffman_table, 1);
  EXPECT_TRUE(h.jfif);
  EXPECT_EQ(h.adobe_transform, -1);
  EXPECT_TRUE(h.has_eoi);
  EXPECT_EQ(h.color_space, JpegColorSpace::kYCbCr);
  EXPECT_EQ(h.subsampling, JpegSubsampling::k420);

  const GpuJpegVerdict v = ClassifyForGpuDecode(jpeg, {});
  EXPECT_EQ(v.reason, GpuJpegReject::kNone);
  EXPECT_EQ(v.width, 333);
  EXPECT_EQ(v.height, 501);
  EXPECT_EQ(v.subsampling, JpegSubsampling::k420);
  EXPECT_EQ(v.num_components, 3);
}

TEST(JpegHeader, SubsamplingsTheEngineTakes) {
  const struct {
    ChromaSubsampling in;
    JpegSubsampling out;
  } cases[] = {{ChromaSubsampling::k444, JpegSubsampling::k444},
               {ChromaSubsampling::k422, JpegSubsampling::k422},
               {ChromaSubsampling::k440, JpegSubsampling::k440}};
  for (const auto& c : cases) {
    const std::vector<uint8_t> jpeg = PatternJpeg(64, 48, c.in);
    EXPECT_EQ(MustParse(jpeg).subsampling, c.out);
    EXPECT_EQ(Reason(jpeg), GpuJpegReject::kNone);
  }
}

TEST(JpegHeader, Subsampling411GoesToTheCpu) {
  const std::vector<uint8_t> jpeg = PatternJpeg(64, 48, ChromaSubsampling::k411);
  const JpegHeader h = MustParse(jpeg);
  EXPECT_EQ(h.components[0].h, 4);
  EXPECT_EQ(h.components[0].v, 1);
  EXPECT_EQ(h.subsampling, JpegSubsampling::k411);
  EXPECT_EQ(Reason(jpeg), GpuJpegReject::kUnsupportedSubsampling);
}

TEST(JpegHeader, ProgressiveGoesToTheCpu) {
  testutil::JpegEncodeOptions options;
  options.progressive = true;
  const std::vector<uint8_t> jpeg = PatternJpeg(80, 60, options);
  const JpegHeader h = MustParse(jpeg);
  EXPECT_EQ(h.coding, JpegCoding::kProgressive);
  EXPECT_TRUE(h.has_eoi);
  EXPECT_EQ(Reason(jpeg), GpuJpegReject::kProgressive);
}

TEST(JpegHeader, GrayscaleGoesToTheGpu) {
  std::vector<uint8_t> gray(37 * 29);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = static_cast<uint8_t>(i * 7);
  const std::vector<uint8_t> jpeg = testutil::EncodeGrayJpeg(gray.data(), 37, 29, 90);
  const JpegHeader h = MustParse(jpeg);
  EXPECT_EQ(h.num_components, 1);
  EXPECT_EQ(h.color_space, JpegColorSpace::kGray);
  EXPECT_EQ(h.subsampling, JpegSubsampling::kGray);
  EXPECT_EQ(h.first_scan_components, 1);
  EXPECT_EQ(Reason(jpeg), GpuJpegReject::kNone);
}

TEST(JpegHeader, AdobeCmykGoesToTheCpu) {
  std::vector<uint8_t> cmyk(20 * 10 * 4, 100);
  const std::vector<uint8_t> jpeg = testutil::EncodeCmykJpeg(cmyk.data(), 20, 10, 90);
  const JpegHeader h = MustParse(jpeg);
  EXPECT_EQ(h.num_components, 4);
  EXPECT_EQ(h.adobe_transform, 0);
  EXPECT_FALSE(h.jfif);
  EXPECT_EQ(h.color_space, JpegColorSpace::kCmyk);
  EXPECT_EQ(Reason(jpeg), GpuJpegReject::kCmyk);
}

TEST(JpegHeader, RgbWithoutTransformGoesToTheCpu) {
  testutil::JpegEncodeOptions options;
  options.store_rgb = true;
  options.subsampling = ChromaSubsampling::k444;
  const std::vector<uint8_t> jpeg = PatternJpeg(40, 30, options);
  const JpegHeader h = MustParse(jpeg);
  EXPECT_EQ(h.adobe_transform, 0);
  EXPECT_FALSE(h.jfif);
  EXPECT_EQ(h.components[0].id, 'R');
  EXPECT_EQ(h.color_space, JpegColorSpace::kRgb);
  EXPECT_EQ(Reason(jpeg), GpuJpegReject::kUnsupportedColorSpace);
}

TEST(JpegHeader, RestartIntervalIsRead) {
  testutil::JpegEncodeOptions options;
  options.restart_interval = 3;
  const std::vector<uint8_t> jpeg = PatternJpeg(64, 64, options);
  EXPECT_EQ(MustParse(jpeg).restart_interval, 3);
  EXPECT_EQ(Reason(jpeg), GpuJpegReject::kNone);
}

TEST(JpegHeader, CutShortInTheScanIsCorrupt) {
  const std::vector<uint8_t> jpeg = PatternJpeg(200, 150, ChromaSubsampling::k420);
  const std::vector<uint8_t> cut(jpeg.begin(), jpeg.begin() + jpeg.size() / 2);
  const JpegHeader h = MustParse(cut);
  EXPECT_FALSE(h.has_eoi);
  const GpuJpegVerdict v = ClassifyForGpuDecode(cut, {});
  EXPECT_EQ(v.reason, GpuJpegReject::kCorrupt);
  EXPECT_EQ(v.width, 200);  // the header itself was fine
}

TEST(JpegHeader, DataAfterEoiIsAllowed) {
  std::vector<uint8_t> jpeg = PatternJpeg(32, 32, ChromaSubsampling::k420);
  for (int i = 0; i < 100; ++i) jpeg.push_back(static_cast<uint8_t>(i));
  EXPECT_TRUE(MustParse(jpeg).has_eoi);
  EXPECT_EQ(Reason(jpeg), GpuJpegReject::kNone);
}

TEST(JpegHeader, EveryPrefixIsHandled) {
  // No prefix may read out of bounds (ASan builds check) or be taken by the GPU.
  const std::vector<uint8_t> jpeg = PatternJpeg(24, 16, ChromaSubsampling::k420);
  for (size_t n = 0; n + 2 < jpeg.size(); ++n) {
    const std::vector<uint8_t> prefix(jpeg.begin(), jpeg.begin() + n);
    EXPECT_EQ(Reason(prefix), GpuJpegReject::kCorrupt) << n << " bytes";
  }
  EXPECT_EQ(Reason(jpeg), GpuJpegReject::kNone);
}

TEST(JpegHeader, CutBeforeTheScanIsAnError) {
  const std::vector<uint8_t> jpeg = PatternJpeg(64, 64, ChromaSubsampling::k420);
  const std::vector<uint8_t> cut(jpeg.begin(), jpeg.begin() + 100);
  absl::StatusOr<JpegHeader> h = ParseJpegHeader(cut);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(h.status().message(), HasSubstr("corrupt JPEG header"));
  const GpuJpegVerdict v = ClassifyForGpuDecode(cut, {});
  EXPECT_EQ(v.reason, GpuJpegReject::kCorrupt);
  EXPECT_EQ(v.width, 0);
}

TEST(JpegHeader, NotAJpeg) {
  const std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A, 0, 0};
  absl::StatusOr<JpegHeader> h = ParseJpegHeader(png);
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(h.status().message(), HasSubstr("not a JPEG"));
  EXPECT_EQ(Reason(png), GpuJpegReject::kCorrupt);
  EXPECT_EQ(Reason({}), GpuJpegReject::kCorrupt);
}

TEST(JpegHeader, TooLarge) {
  const std::vector<uint8_t> jpeg = PatternJpeg(100, 80, ChromaSubsampling::k420);
  EXPECT_EQ(Reason(jpeg, GpuJpegLimits{8000}), GpuJpegReject::kNone);
  EXPECT_EQ(Reason(jpeg, GpuJpegLimits{7999}), GpuJpegReject::kTooLarge);
}

// ---------------------------------------------------------------- hand-built headers

struct Comp {
  uint8_t id, h, v;
};

// SOI, optional JFIF APP0, DHT tables with the given ids (one DC table each), SOF `sof`, SOS
// naming `scan` (default: every component), a few bytes of "entropy data", EOI.
struct HeaderSpec {
  uint8_t sof = 0xC0;
  int precision = 8;
  int width = 16, height = 8;
  std::vector<Comp> comps = {{1, 2, 2}, {2, 1, 1}, {3, 1, 1}};
  std::vector<uint8_t> scan;  // component ids; empty: all
  std::vector<int> huffman_ids = {0, 1};
  bool jfif = true;
  bool eoi = true;
};

void Put16(std::vector<uint8_t>& out, int v) {
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}

std::vector<uint8_t> Build(const HeaderSpec& s) {
  std::vector<uint8_t> out = {0xFF, 0xD8};
  if (s.jfif) {
    out.insert(out.end(), {0xFF, 0xE0, 0, 16, 'J', 'F', 'I', 'F', 0, 1, 1, 0, 0, 1, 0, 1, 0, 0});
  }
  for (int id : s.huffman_ids) {
    out.insert(out.end(), {0xFF, 0xC4});
    Put16(out, 2 + 17 + 1);
    out.push_back(static_cast<uint8_t>(id));  // class 0 (DC)
    out.push_back(1);                         // one code of length 1
    for (int i = 2; i <= 16; ++i) out.push_back(0);
    out.push_back(0);  // its symbol
  }
  out.insert(out.end(), {0xFF, s.sof});
  Put16(out, 8 + 3 * static_cast<int>(s.comps.size()));
  out.push_back(static_cast<uint8_t>(s.precision));
  Put16(out, s.height);
  Put16(out, s.width);
  out.push_back(static_cast<uint8_t>(s.comps.size()));
  for (const Comp& c : s.comps) {
    out.insert(out.end(), {c.id, static_cast<uint8_t>(c.h << 4 | c.v), 0});
  }
  std::vector<uint8_t> scan = s.scan;
  if (scan.empty()) {
    for (const Comp& c : s.comps) scan.push_back(c.id);
  }
  out.insert(out.end(), {0xFF, 0xDA});
  Put16(out, 6 + 2 * static_cast<int>(scan.size()));
  out.push_back(static_cast<uint8_t>(scan.size()));
  for (uint8_t id : scan) out.insert(out.end(), {id, 0x00});
  out.insert(out.end(), {0, 63, 0});
  out.insert(out.end(), {0x12, 0xFF, 0x00, 0x34, 0xFF, 0xD0, 0x56});  // stuffing, RST0
  if (s.eoi) out.insert(out.end(), {0xFF, 0xD9});
  return out;
}

TEST(JpegHeaderBuilt, BuilderMakesAnAcceptedBaseline) {
  EXPECT_EQ(Reason(Build({})), GpuJpegReject::kNone);
  HeaderSpec no_eoi;
  no_eoi.eoi = false;
  EXPECT_EQ(Reason(Build(no_eoi)), GpuJpegReject::kCorrupt);
}

TEST(JpegHeaderBuilt, ExtendedSequential8BitWithTwoTablesIsBaseline) {
  HeaderSpec s;
  s.sof = 0xC1;
  EXPECT_EQ(MustParse(Build(s)).coding, JpegCoding::kExtendedSequential);
  EXPECT_EQ(Reason(Build(s)), GpuJpegReject::kNone);
  s.huffman_ids = {0, 1, 2, 3};
  EXPECT_EQ(MustParse(Build(s)).max_huffman_table, 3);
  EXPECT_EQ(Reason(Build(s)), GpuJpegReject::kUnsupportedCoding);
}

TEST(JpegHeaderBuilt, TwelveBitGoesToTheCpu) {
  HeaderSpec s;
  s.sof = 0xC1;
  s.precision = 12;
  EXPECT_EQ(MustParse(Build(s)).precision, 12);
  EXPECT_EQ(Reason(Build(s)), GpuJpegReject::kUnsupportedCoding);
}

TEST(JpegHeaderBuilt, LosslessHierarchicalArithmeticGoToTheCpu) {
  const struct {
    uint8_t sof;
    JpegCoding coding;
  } cases[] = {{0xC3, JpegCoding::kLossless},     {0xC5, JpegCoding::kHierarchical},
               {0xC7, JpegCoding::kHierarchical}, {0xC9, JpegCoding::kArithmetic},
               {0xCA, JpegCoding::kArithmetic},   {0xCF, JpegCoding::kArithmetic}};
  for (const auto& c : cases) {
    HeaderSpec s;
    s.sof = c.sof;
    EXPECT_EQ(MustParse(Build(s)).coding, c.coding) << int{c.sof};
    EXPECT_EQ(Reason(Build(s)), GpuJpegReject::kUnsupportedCoding) << int{c.sof};
  }
}

TEST(JpegHeaderBuilt, SeveralSequentialScansGoToTheCpu) {
  HeaderSpec s;
  s.scan = {1};  // the first of three non-interleaved scans
  EXPECT_EQ(MustParse(Build(s)).first_scan_components, 1);
  EXPECT_EQ(Reason(Build(s)), GpuJpegReject::kUnsupportedCoding);
}

TEST(JpegHeaderBuilt, ColorSpaceFromComponentIdsWithoutMarkers) {
  HeaderSpec s;
  s.jfif = false;
  s.comps = {{'R', 1, 1}, {'G', 1, 1}, {'B', 1, 1}};
  EXPECT_EQ(MustParse(Build(s)).color_space, JpegColorSpace::kRgb);
  EXPECT_EQ(Reason(Build(s)), GpuJpegReject::kUnsupportedColorSpace);
  s.jfif = true;  // JFIF means YCbCr whatever the ids
  EXPECT_EQ(MustParse(Build(s)).color_space, JpegColorSpace::kYCbCr);
  EXPECT_EQ(Reason(Build(s)), GpuJpegReject::kNone);
}

TEST(JpegHeaderBuilt, TwoAndFiveComponentsGoToTheCpu) {
  HeaderSpec s;
  s.comps = {{1, 1, 1}, {2, 1, 1}};
  EXPECT_EQ(Reason(Build(s)), GpuJpegReject::kUnsupportedColorSpace);
  s.comps = {{1, 1, 1}, {2, 1, 1}, {3, 1, 1}, {4, 1, 1}, {5, 1, 1}};
  s.scan = {1, 2, 3, 4};  // a scan holds at most four
  const JpegHeader h = MustParse(Build(s));
  EXPECT_EQ(h.num_components, 5);
  EXPECT_EQ(h.color_space, JpegColorSpace::kOther);
  EXPECT_EQ(Reason(Build(s)), GpuJpegReject::kUnsupportedCoding);
}

TEST(JpegHeaderBuilt, IrregularSamplingGoesToTheCpu) {
  HeaderSpec s;
  s.comps = {{1, 2, 2}, {2, 2, 1}, {3, 1, 1}};
  EXPECT_EQ(MustParse(Build(s)).subsampling, JpegSubsampling::kOther);
  EXPECT_EQ(Reason(Build(s)), GpuJpegReject::kUnsupportedSubsampling);
  s.comps = {{1, 4, 2}, {2, 1, 1}, {3, 1, 1}};
  EXPECT_EQ(MustParse(Build(s)).subsampling, JpegSubsampling::k410);
  EXPECT_EQ(Reason(Build(s)), GpuJpegReject::kUnsupportedSubsampling);
}

TEST(JpegHeaderBuilt, FillBytesBeforeMarkers) {
  std::vector<uint8_t> jpeg = Build({});
  jpeg.insert(jpeg.begin() + 2, {0xFF, 0xFF, 0xFF});  // fill bytes before APP0's FF E0
  EXPECT_EQ(Reason(jpeg), GpuJpegReject::kNone);
}

void ExpectCorrupt(const std::vector<uint8_t>& jpeg, const std::string& message) {
  absl::StatusOr<JpegHeader> h = ParseJpegHeader(jpeg);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(h.status().message(), HasSubstr(message));
  EXPECT_EQ(Reason(jpeg), GpuJpegReject::kCorrupt);
}

TEST(JpegHeaderBuilt, MalformedHeaders) {
  HeaderSpec zero_height;
  zero_height.height = 0;
  ExpectCorrupt(Build(zero_height), "height 0");
  HeaderSpec zero_width;
  zero_width.width = 0;
  ExpectCorrupt(Build(zero_width), "width 0");
  HeaderSpec bad_factor;
  bad_factor.comps = {{1, 5, 1}, {2, 1, 1}, {3, 1, 1}};
  ExpectCorrupt(Build(bad_factor), "sampling factors 5x1");
  HeaderSpec unknown_component;
  unknown_component.scan = {1, 2, 9};
  ExpectCorrupt(Build(unknown_component), "component the frame lacks");

  std::vector<uint8_t> two_frames = Build({});
  const std::vector<uint8_t> sof = {0xFF, 0xC0, 0, 11, 8, 0, 8, 0, 8, 1, 1, 0x11, 0};
  two_frames.insert(two_frames.begin() + 2, sof.begin(), sof.end());
  ExpectCorrupt(two_frames, "second frame header");

  const std::vector<uint8_t> scan_first = {0xFF, 0xD8, 0xFF, 0xDA, 0, 8, 1, 1, 0, 0, 63, 0};
  ExpectCorrupt(scan_first, "scan before the frame header");

  std::vector<uint8_t> long_segment = {0xFF, 0xD8, 0xFF, 0xE1, 0x40, 0x00, 1, 2, 3};
  ExpectCorrupt(long_segment, "data ends inside a marker segment");

  std::vector<uint8_t> junk = Build({});
  junk[2] = 0x00;  // APP0's 0xFF
  ExpectCorrupt(junk, "expected a marker");

  const std::vector<uint8_t> early_eoi = {0xFF, 0xD8, 0xFF, 0xD9};
  ExpectCorrupt(early_eoi, "EOI before the first scan");
}

TEST(GpuJpegReject, NamesAreDistinct) {
  std::set<std::string> names;
  for (int i = 0; i < kNumGpuJpegRejects; ++i) {
    names.insert(std::string(GpuJpegRejectName(static_cast<GpuJpegReject>(i))));
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kNumGpuJpegRejects));
  EXPECT_EQ(GpuJpegRejectName(GpuJpegReject::kProgressive), "progressive");
  EXPECT_EQ(names.count("unknown"), 0u);
}

}  // namespace
}  // namespace ferry
