// ApplyPhotometricReference, the host form of photometric.h's program, against values
// computed by hand (and, for hue, against a float64 HSV round trip written here in the
// textbook chroma form, independent of torchvision's). Needs no device. The GPU kernel is
// checked against this reference in kernels_test.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/kernels/photometric.h"

namespace ferry {
namespace {

PhotometricOp Op(PhotometricKind kind, float a = 0) {
  PhotometricOp op;
  op.kind = static_cast<uint32_t>(kind);
  op.a = a;
  return op;
}

PhotometricOp Normalize(const float mean[3], const float std[3]) {
  PhotometricOp op = Op(PhotometricKind::kNormalize);
  for (int c = 0; c < 3; ++c) {
    op.v[c] = mean[c];
    op.w[c] = std[c];
  }
  return op;
}

PhotometricOp Erase(int top, int left, int height, int width, float r, float g, float b) {
  PhotometricOp op = Op(PhotometricKind::kErase);
  op.top = top;
  op.left = left;
  op.height = height;
  op.width = width;
  op.v[0] = r;
  op.v[1] = g;
  op.v[2] = b;
  return op;
}

PhotometricProgram Program(std::initializer_list<PhotometricOp> ops) {
  PhotometricProgram program;
  for (const PhotometricOp& op : ops) program.ops[program.num_ops++] = op;
  return program;
}

// The program on an image of height x width HWC pixels; CHW floats.
std::vector<float> Apply(const std::vector<uint8_t>& hwc, int height, int width,
                         const PhotometricProgram& program) {
  std::vector<float> chw(hwc.size(), -12345.0f);
  ApplyPhotometricReference(hwc.data(), program, height, width, chw.data());
  return chw;
}

// Channel c of pixel i of a CHW image of `pixels` pixels.
float At(const std::vector<float>& chw, int pixels, int c, int i) { return chw[c * pixels + i]; }

constexpr double kGrayR = 0.2989, kGrayG = 0.587, kGrayB = 0.114;
constexpr double kTol = 2e-6;  // float32 rounding of values of order 1

TEST(PhotometricReference, NoOpsIsToDtypeScaled) {
  const std::vector<uint8_t> image = {0, 1, 2, 127, 128, 255};
  const std::vector<float> out = Apply(image, 1, 2, PhotometricProgram());
  // CHW: r of both pixels, then g, then b.
  const int order[6] = {0, 3, 1, 4, 2, 5};
  for (int k = 0; k < 6; ++k) {
    EXPECT_EQ(out[k], static_cast<float>(image[order[k]]) * static_cast<float>(1.0 / 255.0)) << k;
  }
  EXPECT_EQ(out[5], 1.0f);  // 255 / 255 exactly
}

TEST(PhotometricReference, BrightnessScalesAndClamps) {
  const std::vector<uint8_t> image = {51, 102, 255};
  const std::vector<float> out =
      Apply(image, 1, 1, Program({Op(PhotometricKind::kBrightness, 1.5f)}));
  EXPECT_NEAR(out[0], 0.3, kTol);
  EXPECT_NEAR(out[1], 0.6, kTol);
  EXPECT_EQ(out[2], 1.0f);  // 1.5 clamped
}

TEST(PhotometricReference, SaturationBlendsWithGrayAndClamps) {
  const std::vector<uint8_t> red = {255, 0, 0};
  std::vector<float> out = Apply(red, 1, 1, Program({Op(PhotometricKind::kSaturation, 0.5f)}));
  // gray = 0.2989; x * 0.5 + gray * 0.5.
  EXPECT_NEAR(out[0], 0.5 + 0.5 * kGrayR, kTol);
  EXPECT_NEAR(out[1], 0.5 * kGrayR, kTol);
  EXPECT_NEAR(out[2], 0.5 * kGrayR, kTol);
  out = Apply(red, 1, 1, Program({Op(PhotometricKind::kSaturation, 2.0f)}));
  EXPECT_EQ(out[0], 1.0f);  // 2 - 0.2989
  EXPECT_EQ(out[1], 0.0f);  // -0.2989
  EXPECT_EQ(out[2], 0.0f);
  out = Apply(red, 1, 1, Program({Op(PhotometricKind::kSaturation, 0.0f)}));
  EXPECT_NEAR(out[0], kGrayR, kTol);  // factor 0: gray
  EXPECT_NEAR(out[1], kGrayR, kTol);
}

TEST(PhotometricReference, GrayscaleUsesTorchvisionWeights) {
  const std::vector<uint8_t> image = {255, 0, 0, 10, 20, 30};
  const std::vector<float> out = Apply(image, 1, 2, Program({Op(PhotometricKind::kGrayscale)}));
  const double second = (10 * kGrayR + 20 * kGrayG + 30 * kGrayB) / 255;
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(At(out, 2, c, 0), kGrayR, kTol);
    EXPECT_NEAR(At(out, 2, c, 1), second, kTol);
  }
}

TEST(PhotometricReference, ContrastBlendsWithTheMeanOfGray) {
  // gray(red) = 0.2989, gray(blue) = 0.114: mean 0.20645.
  const std::vector<uint8_t> image = {255, 0, 0, 0, 0, 255};
  const double mean = (kGrayR + kGrayB) / 2;
  std::vector<float> out = Apply(image, 1, 2, Program({Op(PhotometricKind::kContrast, 0.5f)}));
  EXPECT_NEAR(At(out, 2, 0, 0), 0.5 + 0.5 * mean, kTol);
  EXPECT_NEAR(At(out, 2, 1, 0), 0.5 * mean, kTol);
  EXPECT_NEAR(At(out, 2, 2, 1), 0.5 + 0.5 * mean, kTol);
  out = Apply(image, 1, 2, Program({Op(PhotometricKind::kContrast, 3.0f)}));
  EXPECT_EQ(At(out, 2, 0, 0), 1.0f);  // 3 - 2 * 0.20645, clamped
  EXPECT_EQ(At(out, 2, 1, 0), 0.0f);  // -2 * 0.20645, clamped
}

// The contrast mean is of the image as it stands at that op: brightness before it (with its
// clamp) changes the mean, so the two orders differ.
TEST(PhotometricReference, ContrastMeanIsTakenAfterTheOpsBeforeIt) {
  const std::vector<uint8_t> image = {51, 51, 51, 153, 153, 153};  // gray levels 0.2, 0.6
  const double w = kGrayR + kGrayG + kGrayB;                       // 0.9999: gray(x,x,x) = w x
  const PhotometricOp brightness = Op(PhotometricKind::kBrightness, 2.0f);
  const PhotometricOp contrast = Op(PhotometricKind::kContrast, 0.5f);

  // Brightness first: 0.4, 1.0 (1.2 clamped); mean of gray (0.4 + 1.0) w / 2.
  std::vector<float> out = Apply(image, 1, 2, Program({brightness, contrast}));
  const double mean_after = (0.4 + 1.0) * w / 2;
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(At(out, 2, c, 0), 0.5 * 0.4 + 0.5 * mean_after, kTol);
    EXPECT_NEAR(At(out, 2, c, 1), 0.5 * 1.0 + 0.5 * mean_after, kTol);
  }
  // Contrast first: mean (0.2 + 0.6) w / 2, then everything doubled (none reaches 1).
  out = Apply(image, 1, 2, Program({contrast, brightness}));
  const double mean_before = (0.2 + 0.6) * w / 2;
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(At(out, 2, c, 0), 2 * (0.5 * 0.2 + 0.5 * mean_before), kTol);
    EXPECT_NEAR(At(out, 2, c, 1), 2 * (0.5 * 0.6 + 0.5 * mean_before), kTol);
  }
  // Two contrasts: the second's mean is of the first's output.
  out = Apply(image, 1, 2, Program({contrast, Op(PhotometricKind::kContrast, 2.0f)}));
  const double first[2] = {0.5 * 0.2 + 0.5 * mean_before, 0.5 * 0.6 + 0.5 * mean_before};
  const double mean_second = (first[0] + first[1]) * w / 2;
  EXPECT_NEAR(At(out, 2, 0, 0), 2 * first[0] - mean_second, kTol);
  EXPECT_NEAR(At(out, 2, 0, 1), 2 * first[1] - mean_second, kTol);
}

TEST(PhotometricReference, NormalizeThenBrightnessClampsAgain) {
  const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  const std::vector<uint8_t> image = {0, 128, 255};
  std::vector<float> out = Apply(image, 1, 1, Program({Normalize(mean, std)}));
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(out[c], (image[c] / 255.0 - mean[c]) / std[c], 4 * kTol) << c;
  }
  // torchvision clamps brightness to [0, 1] on any float image, normalised or not.
  out = Apply(image, 1, 1, Program({Normalize(mean, std), Op(PhotometricKind::kBrightness, 1.0f)}));
  EXPECT_EQ(out[0], 0.0f);  // -2.1 clamped
  EXPECT_NEAR(out[1], (128 / 255.0 - mean[1]) / std[1], 4 * kTol);
  EXPECT_EQ(out[2], 1.0f);  // 2.64 clamped
}

TEST(PhotometricReference, EraseWritesTheBoxClippedToTheImage) {
  const int height = 4, width = 5, pixels = height * width;
  const std::vector<uint8_t> image(pixels * 3, 255);
  // Rows [1, 3), columns [2, 12) -> [2, 5); and rows [-1, 1) -> row 0, columns [0, 1).
  const std::vector<float> out =
      Apply(image, height, width,
            Program({Erase(1, 2, 2, 10, 0.5f, -1.0f, 2.0f), Erase(-1, 0, 2, 1, 0, 0, 0)}));
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const bool first = y >= 1 && y < 3 && x >= 2;
      const bool second = y == 0 && x == 0;
      const float want[3] = {first    ? 0.5f
                             : second ? 0.0f
                                      : 1.0f,
                             first    ? -1.0f
                             : second ? 0.0f
                                      : 1.0f,
                             first    ? 2.0f
                             : second ? 0.0f
                                      : 1.0f};
      for (int c = 0; c < 3; ++c) {
        EXPECT_EQ(At(out, pixels, c, y * width + x), want[c]) << y << "," << x << " c" << c;
      }
    }
  }
}

TEST(PhotometricReference, UnknownKindEndsTheProgram) {
  const std::vector<uint8_t> image = {100, 100, 100};
  PhotometricProgram program = Program({Op(PhotometricKind::kBrightness, 0.5f)});
  program.ops[program.num_ops++].kind = 99;
  program.ops[program.num_ops++] = Op(PhotometricKind::kBrightness, 0.5f);
  EXPECT_NEAR(Apply(image, 1, 1, program)[0], 50 / 255.0, kTol);
}

TEST(PhotometricReference, AtMostMaxOpsRun) {
  const std::vector<uint8_t> image = {200, 200, 200};
  PhotometricProgram program;
  for (int k = 0; k < kMaxPhotometricOps; ++k) {
    program.ops[k] = Op(PhotometricKind::kBrightness, 0.9f);
  }
  program.num_ops = 1000;  // more than the program holds: its kMaxPhotometricOps run
  EXPECT_NEAR(Apply(image, 1, 1, program)[0], 200 / 255.0 * std::pow(0.9, kMaxPhotometricOps),
              kTol);
}

// Hue rotation in float64, the textbook way (chroma, hexcone sector), for x in [0, 1].
void HueShiftDouble(const double in[3], double factor, double out[3]) {
  const double r = in[0], g = in[1], b = in[2];
  const double max = std::max({r, g, b}), min = std::min({r, g, b}), chroma = max - min;
  double h = 0;
  if (chroma > 0) {
    if (max == r) {
      h = (g - b) / chroma;
    } else if (max == g) {
      h = (b - r) / chroma + 2;
    } else {
      h = (r - g) / chroma + 4;
    }
    h /= 6;
  }
  h += factor;
  h -= std::floor(h);
  const double h6 = h * 6;
  const double x = chroma * (1 - std::fabs(std::fmod(h6, 2.0) - 1));
  double rgb[3];
  switch (static_cast<int>(h6) % 6) {
    case 0:
      rgb[0] = chroma, rgb[1] = x, rgb[2] = 0;
      break;
    case 1:
      rgb[0] = x, rgb[1] = chroma, rgb[2] = 0;
      break;
    case 2:
      rgb[0] = 0, rgb[1] = chroma, rgb[2] = x;
      break;
    case 3:
      rgb[0] = 0, rgb[1] = x, rgb[2] = chroma;
      break;
    case 4:
      rgb[0] = x, rgb[1] = 0, rgb[2] = chroma;
      break;
    default:
      rgb[0] = chroma, rgb[1] = 0, rgb[2] = x;
      break;
  }
  for (int c = 0; c < 3; ++c) out[c] = rgb[c] + (max - chroma);
}

TEST(PhotometricReference, HueMatchesFloat64Hsv) {
  // Every byte triple on a coarse grid: primaries, secondaries, grays, ties between channels.
  std::vector<uint8_t> image;
  for (int r = 0; r <= 255; r += 17) {
    for (int g = 0; g <= 255; g += 17) {
      for (int b = 0; b <= 255; b += 17)
        image.insert(image.end(), {uint8_t(r), uint8_t(g), uint8_t(b)});
    }
  }
  const int pixels = static_cast<int>(image.size() / 3);
  for (float factor : {-0.5f, -0.3f, -0.01f, 0.0f, 0.125f, 1.0f / 3, 0.4999f, 0.5f}) {
    const std::vector<float> out =
        Apply(image, 1, pixels, Program({Op(PhotometricKind::kHue, factor)}));
    double worst = 0;
    for (int i = 0; i < pixels; ++i) {
      const double in[3] = {image[3 * i] / 255.0, image[3 * i + 1] / 255.0,
                            image[3 * i + 2] / 255.0};
      double want[3];
      HueShiftDouble(in, factor, want);
      for (int c = 0; c < 3; ++c) {
        const double diff = std::fabs(At(out, pixels, c, i) - want[c]);
        worst = std::max(worst, diff);
        ASSERT_LE(diff, 1e-5) << "factor " << factor << " pixel (" << int(image[3 * i]) << ", "
                              << int(image[3 * i + 1]) << ", " << int(image[3 * i + 2])
                              << ") channel " << c << ": got " << At(out, pixels, c, i) << ", want "
                              << want[c];
      }
    }
    EXPECT_LE(worst, 1e-5) << factor;
  }
  // A gray pixel has no hue: it stays as it is under any rotation.
  const std::vector<float> gray =
      Apply({90, 90, 90}, 1, 1, Program({Op(PhotometricKind::kHue, 0.3f)}));
  for (int c = 0; c < 3; ++c) EXPECT_FLOAT_EQ(gray[c], 90 / 255.0f);
  // A half turn takes red to cyan.
  const std::vector<float> cyan =
      Apply({255, 0, 0}, 1, 1, Program({Op(PhotometricKind::kHue, 0.5f)}));
  EXPECT_NEAR(cyan[0], 0.0, kTol);
  EXPECT_NEAR(cyan[1], 1.0, kTol);
  EXPECT_NEAR(cyan[2], 1.0, kTol);
}

}  // namespace
}  // namespace ferry
