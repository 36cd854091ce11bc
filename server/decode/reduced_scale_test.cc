// How far reduced-scale JPEG decoding moves pixels from a full decode, by DCT scale, on
// photographs (testing/data/photos) and on images of fine detail (sensor noise and stripes,
// made here): the figures docs/data.md ("Reduced-scale decode, and full_decode") states.
// Each figure there is an upper bound this test holds, for the default (the smallest scale
// held at 1/2) and for decoding at every scale down to 1/8 (smallest_dct_scale 1).
//
// For RandomResizedCrop crops (torchvision's scale and ratio; sizes 224 and 56, so that the
// photographs, 300-640 px, reach every scale), grouped by the scale each crop allows (1/2
// when its sides are >= 2 * size, 1/4 >= 4 * size, 1/8 >= 8 * size): the mean absolute
// difference from full_decode per file over its crops' channels, the mean and worst of that
// over the files, and the largest difference of one value.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "server/decode/image_transform.h"
#include "testing/jpeg_writer.h"

namespace ferry {
namespace {

using testutil::EncodeJpeg;
using testutil::JpegEncodeOptions;
using testutil::MakeTestPattern;

struct Jpeg {
  std::string name;
  std::vector<uint8_t> bytes;
  int width = 0, height = 0;
};

std::vector<Jpeg> Photographs() {
  std::vector<Jpeg> out;
  for (const auto& e : std::filesystem::directory_iterator(FERRY_TEST_PHOTOS)) {
    if (e.path().extension() != ".jpg") continue;
    std::ifstream in(e.path(), std::ios::binary);
    out.push_back({e.path().filename(),
                   {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()}});
  }
  std::sort(out.begin(), out.end(), [](const Jpeg& a, const Jpeg& b) { return a.name < b.name; });
  return out;
}

// What a camera records that a smooth test pattern lacks: a photograph-like base (the test
// pattern, smoothed), per-pixel sensor noise of about 10 levels, and fabric-like stripes of
// period 2-5 px over a quarter of the image. Quality 95, 4:2:0.
std::vector<Jpeg> DetailedImages() {
  std::vector<Jpeg> out;
  const int w = 1024, h = 768;
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    std::vector<uint8_t> rgb = MakeTestPattern(w, h, seed);
    Rng rng(MixSeed(11, seed));
    const int period = 2 + static_cast<int>(seed % 4);
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        const bool striped = x >= w / 4 && x < 3 * w / 4 && y >= h / 4 && y < 3 * h / 4;
        const int stripe = striped ? ((x % period) * 2 < period ? 40 : -40) : 0;
        for (int c = 0; c < 3; ++c) {
          // Sum of four uniforms in [-8, 8): roughly normal, sigma ~9.2 levels.
          int noise = 0;
          for (int k = 0; k < 4; ++k) noise += static_cast<int>(rng.Below(16)) - 8;
          uint8_t& v = rgb[(static_cast<size_t>(y) * w + x) * 3 + c];
          v = static_cast<uint8_t>(std::clamp(v + noise + stripe, 0, 255));
        }
      }
    }
    JpegEncodeOptions o;
    o.quality = 95;
    out.push_back({"detailed" + std::to_string(seed), EncodeJpeg(rgb.data(), w, h, o), w, h});
  }
  return out;
}

struct Figures {
  double mean = 0;        // of the files' mean absolute differences
  double worst_file = 0;  // the largest of them
  int worst_value = 0;    // the largest difference of one channel value
};

// Figures for the crops each scale allows, decoded with `smallest_dct_scale`.
std::map<int, Figures> Measure(std::vector<Jpeg>& files, int smallest_dct_scale) {
  ImageDecoder decoder;
  std::map<int, std::map<std::string, std::pair<double, double>>> sums;  // scale, file
  std::map<int, Figures> figures;
  for (Jpeg& f : files) {
    if (f.width == 0) {
      std::vector<uint8_t> rgb;
      EXPECT_TRUE(decoder.DecodeRgb(f.bytes, &rgb, &f.width, &f.height).ok()) << f.name;
    }
    for (int size : {224, 56}) {
      for (uint64_t c = 0; c < 16; ++c) {
        ImageTransform t = ImageTransform::RandomResizedCrop(size, false);
        t.smallest_dct_scale = 1;
        Rng plan(MixSeed(7, c));
        const int allowed = JpegDctScale(PlanSourceWindow(f.width, f.height, t, plan), t);
        if (allowed == 8) continue;
        t.smallest_dct_scale = smallest_dct_scale;
        std::vector<uint8_t> scaled(static_cast<size_t>(size) * size * 3), full(scaled.size());
        Rng a(MixSeed(7, c)), b(MixSeed(7, c));
        EXPECT_TRUE(DecodeAndTransform(decoder, f.bytes, t, a, absl::MakeSpan(scaled)).ok());
        t.full_decode = true;
        EXPECT_TRUE(DecodeAndTransform(decoder, f.bytes, t, b, absl::MakeSpan(full)).ok());
        auto& [sum, values] = sums[allowed][f.name];
        for (size_t i = 0; i < full.size(); ++i) {
          const int d = std::abs(static_cast<int>(scaled[i]) - static_cast<int>(full[i]));
          sum += d;
          figures[allowed].worst_value = std::max(figures[allowed].worst_value, d);
        }
        values += static_cast<double>(full.size());
      }
    }
  }
  for (auto& [scale, by_file] : sums) {
    Figures& fig = figures[scale];
    for (const auto& [name, sv] : by_file) {
      const double mean = sv.first / sv.second;
      fig.mean += mean / static_cast<double>(by_file.size());
      fig.worst_file = std::max(fig.worst_file, mean);
    }
  }
  return figures;
}

// The bounds docs/data.md states: {scale in eighths, mean, worst file, worst value}.
struct Bound {
  int scale;
  double mean, worst_file;
  int worst_value;
};

void Hold(const char* what, std::vector<Jpeg>& files, int smallest, std::vector<Bound> bounds) {
  const std::map<int, Figures> figures = Measure(files, smallest);
  for (const Bound& b : bounds) {
    SCOPED_TRACE(std::string(what) + " at 1/" + std::to_string(8 / b.scale));
    ASSERT_EQ(figures.count(b.scale), 1u) << "no crop allowed this scale";
    const Figures& f = figures.at(b.scale);
    std::printf(
        "%-12s smallest 1/%d, crops allowing 1/%d: mean %.3f, worst file %.3f, worst "
        "value %d\n",
        what, 8 / smallest, 8 / b.scale, f.mean, f.worst_file, f.worst_value);
    EXPECT_LE(f.mean, b.mean);
    EXPECT_LE(f.worst_file, b.worst_file);
    EXPECT_LE(f.worst_value, b.worst_value);
  }
}

TEST(ReducedScaleTest, PhotographsStayWithinTheDocumentedDifferences) {
  std::vector<Jpeg> photos = Photographs();
  ASSERT_EQ(photos.size(), 4u);
  // The default: 1/2 at most, then an antialiased shrink.
  Hold("photographs", photos, 4, {{4, 0.82, 1.34, 33}, {2, 0.37, 0.45, 22}, {1, 0.26, 0.26, 9}});
  // Every scale (smallest_dct_scale 1): what the default leaves out.
  Hold("photographs", photos, 1, {{2, 1.14, 1.55, 39}, {1, 3.06, 3.06, 37}});
}

TEST(ReducedScaleTest, DetailedImagesStayWithinTheDocumentedDifferences) {
  std::vector<Jpeg> detailed = DetailedImages();
  Hold("detailed", detailed, 4, {{4, 2.28, 3.39, 24}, {2, 0.41, 0.56, 6}, {1, 0.18, 0.21, 4}});
  Hold("detailed", detailed, 1, {{2, 0.79, 1.09, 8}, {1, 0.71, 0.95, 8}});
}

}  // namespace
}  // namespace ferry
