// Properties of image_ops.h that hold whatever torchvision computes; agreement with
// torchvision itself is image_ops_torchvision_test.
#include "server/decode/image_ops.h"

#include <algorithm>
#include <set>

#include "gtest/gtest.h"

namespace ferry {
namespace {

RgbImage TestImage(int width, int height, uint64_t seed) {
  RgbImage image;
  image.Resize(width, height);
  Rng rng(seed);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      uint8_t* p = image.row(y) + x * 3;
      p[0] = static_cast<uint8_t>((x * 255) / std::max(1, width - 1));
      p[1] = static_cast<uint8_t>((y * 255) / std::max(1, height - 1));
      p[2] = static_cast<uint8_t>(rng.Below(256));
    }
  }
  return image;
}

bool SamePixels(const RgbImage& a, const RgbImage& b) {
  return a.width == b.width && a.height == b.height && a.pixels == b.pixels;
}

const uint8_t* At(const RgbImage& image, int x, int y) { return image.row(y) + x * 3; }

TEST(ImageOpsTest, FlipsMirrorAndUndoThemselves) {
  const RgbImage original = TestImage(7, 5, 1);
  RgbImage image = original;
  HorizontalFlip(image);
  EXPECT_TRUE(std::equal(At(image, 0, 2), At(image, 0, 2) + 3, At(original, 6, 2)));
  EXPECT_FALSE(SamePixels(image, original));
  HorizontalFlip(image);
  EXPECT_TRUE(SamePixels(image, original));
  VerticalFlip(image);
  EXPECT_TRUE(std::equal(At(image, 3, 0), At(image, 3, 0) + 3, At(original, 3, 4)));
  VerticalFlip(image);
  EXPECT_TRUE(SamePixels(image, original));
}

TEST(ImageOpsTest, PadGeometryAndModes) {
  const RgbImage image = TestImage(4, 3, 2);
  const std::array<uint8_t, 3> fill = {1, 2, 3};
  RgbImage out;
  Pad(image, 2, 1, 3, 2, PaddingMode::kConstant, fill, &out);
  ASSERT_EQ(out.width, 9);
  ASSERT_EQ(out.height, 6);
  EXPECT_TRUE(std::equal(At(out, 0, 0), At(out, 0, 0) + 3, fill.begin()));
  EXPECT_TRUE(std::equal(At(out, 8, 5), At(out, 8, 5) + 3, fill.begin()));
  EXPECT_TRUE(std::equal(At(out, 2, 1), At(out, 2, 1) + 3, At(image, 0, 0)));
  // Cropping the padding away gives the image back.
  RgbImage inner;
  Crop(out, 1, 2, 3, 4, &inner);
  EXPECT_TRUE(SamePixels(inner, image));

  // Column -1 and -2 of the padded row 0 under each mode (source columns 0..3).
  Pad(image, 2, 0, 0, 0, PaddingMode::kEdge, fill, &out);
  EXPECT_TRUE(std::equal(At(out, 0, 0), At(out, 0, 0) + 3, At(image, 0, 0)));
  EXPECT_TRUE(std::equal(At(out, 1, 0), At(out, 1, 0) + 3, At(image, 0, 0)));
  Pad(image, 2, 0, 0, 0, PaddingMode::kReflect, fill, &out);
  EXPECT_TRUE(std::equal(At(out, 0, 0), At(out, 0, 0) + 3, At(image, 2, 0)));
  EXPECT_TRUE(std::equal(At(out, 1, 0), At(out, 1, 0) + 3, At(image, 1, 0)));
  Pad(image, 2, 0, 0, 0, PaddingMode::kSymmetric, fill, &out);
  EXPECT_TRUE(std::equal(At(out, 0, 0), At(out, 0, 0) + 3, At(image, 1, 0)));
  EXPECT_TRUE(std::equal(At(out, 1, 0), At(out, 1, 0) + 3, At(image, 0, 0)));
  // Bottom rows under reflect: rows 1 then 0 of a 3-row image.
  Pad(image, 0, 0, 0, 2, PaddingMode::kReflect, fill, &out);
  EXPECT_TRUE(std::equal(out.row(3), out.row(3) + 12, image.row(1)));
  EXPECT_TRUE(std::equal(out.row(4), out.row(4) + 12, image.row(0)));
}

TEST(ImageOpsTest, ResizeKeepsSizeAsIsAndFlatImagesFlat) {
  const RgbImage image = TestImage(16, 12, 3);
  RgbImage out;
  ResizeBilinear(image, 12, 16, &out);
  EXPECT_TRUE(SamePixels(out, image));
  RgbImage flat;
  flat.Resize(20, 10);
  std::fill(flat.pixels.begin(), flat.pixels.end(), 77);
  ResizeBilinear(flat, 7, 9, &out);
  ASSERT_EQ(out.width, 9);
  ASSERT_EQ(out.height, 7);
  EXPECT_TRUE(std::all_of(out.pixels.begin(), out.pixels.end(), [](uint8_t v) { return v == 77; }));
}

TEST(ImageOpsTest, NeutralColourFactorsAreIdentity) {
  const RgbImage original = TestImage(9, 8, 4);
  RgbImage image = original;
  AdjustBrightness(image, 1.0f);
  AdjustContrast(image, 1.0f);
  AdjustSaturation(image, 1.0f);
  EXPECT_TRUE(SamePixels(image, original));
  AdjustHue(image, 0.0f);  // through float HSV; uint8 -> float -> uint8 loses nothing
  EXPECT_TRUE(SamePixels(image, original));
}

TEST(ImageOpsTest, ColourFactorsAtTheirExtremes) {
  const RgbImage original = TestImage(9, 8, 5);
  RgbImage image = original;
  AdjustBrightness(image, 0.0f);
  EXPECT_TRUE(
      std::all_of(image.pixels.begin(), image.pixels.end(), [](uint8_t v) { return v == 0; }));
  image = original;
  AdjustBrightness(image, 2.0f);
  for (size_t i = 0; i < image.pixels.size(); ++i) {
    EXPECT_EQ(image.pixels[i], std::min(255, 2 * original.pixels[i]));
  }
  // Contrast 0 leaves one value everywhere (the mean gray); saturation 0 makes gray pixels.
  image = original;
  AdjustContrast(image, 0.0f);
  EXPECT_TRUE(std::all_of(image.pixels.begin(), image.pixels.end(),
                          [&](uint8_t v) { return v == image.pixels[0]; }));
  image = original;
  AdjustSaturation(image, 0.0f);
  for (size_t i = 0; i < image.pixels.size(); i += 3) {
    EXPECT_EQ(image.pixels[i], image.pixels[i + 1]);
    EXPECT_EQ(image.pixels[i], image.pixels[i + 2]);
  }
}

TEST(ImageOpsTest, HueTurnsPrimaries) {
  RgbImage image;
  image.Resize(1, 1);
  image.pixels = {255, 0, 0};
  AdjustHue(image, 1.0f / 3.0f);  // red -> green
  EXPECT_EQ(image.pixels, (std::vector<uint8_t>{0, 255, 0}));
  AdjustHue(image, -1.0f / 3.0f);  // and back
  EXPECT_EQ(image.pixels, (std::vector<uint8_t>{255, 0, 0}));
  image.pixels = {90, 90, 90};  // no hue: unchanged
  AdjustHue(image, 0.4f);
  EXPECT_EQ(image.pixels, (std::vector<uint8_t>{90, 90, 90}));
}

TEST(ImageOpsTest, GrayscaleHasEqualChannelsAndTheLumaWeights) {
  RgbImage image = TestImage(6, 5, 6);
  RgbImage pure;
  pure.Resize(3, 1);
  pure.pixels = {255, 0, 0, 0, 255, 0, 0, 0, 255};
  RgbToGrayscale(pure);
  // 0.2989, 0.587, 0.114 of 255, truncated.
  EXPECT_EQ(pure.pixels, (std::vector<uint8_t>{76, 76, 76, 149, 149, 149, 29, 29, 29}));
  RgbToGrayscale(image);
  for (size_t i = 0; i < image.pixels.size(); i += 3) {
    EXPECT_EQ(image.pixels[i], image.pixels[i + 1]);
    EXPECT_EQ(image.pixels[i], image.pixels[i + 2]);
  }
}

TEST(ImageOpsTest, EqualizeIsIdempotentAndSpreadsTheHistogram) {
  RgbImage image = TestImage(32, 24, 7);
  // Squeeze the range, so that equalizing has work to do.
  for (uint8_t& v : image.pixels) v = static_cast<uint8_t>(100 + v / 8);
  AugmentParams equalize{AugmentOp::kEqualize, 0};
  RgbImage scratch;
  ApplyAugment(equalize, {0, 0, 0}, image, &scratch);
  uint8_t lo = 255, hi = 0;
  for (size_t i = 0; i < image.pixels.size(); i += 3) {
    lo = std::min(lo, image.pixels[i]);
    hi = std::max(hi, image.pixels[i]);
  }
  EXPECT_LT(lo, 20);
  EXPECT_GT(hi, 230);
  const RgbImage once = image;
  ApplyAugment(equalize, {0, 0, 0}, image, &scratch);
  // A second pass maps each occupied level to itself or nearly (PIL's LUT rounds).
  for (size_t i = 0; i < image.pixels.size(); ++i) {
    EXPECT_NEAR(image.pixels[i], once.pixels[i], 10) << i;
  }
}

TEST(ImageOpsTest, AutoContrastStretchesEachChannel) {
  RgbImage image = TestImage(10, 10, 8);
  for (uint8_t& v : image.pixels) v = static_cast<uint8_t>(50 + v / 4);
  RgbImage scratch;
  ApplyAugment({AugmentOp::kAutoContrast, 0}, {0, 0, 0}, image, &scratch);
  for (int c = 0; c < 3; ++c) {
    uint8_t lo = 255, hi = 0;
    for (size_t i = c; i < image.pixels.size(); i += 3) {
      lo = std::min(lo, image.pixels[i]);
      hi = std::max(hi, image.pixels[i]);
    }
    EXPECT_EQ(lo, 0) << c;
    // max / ((max - min) / 255) in float32 can land just under 255, which torch truncates.
    EXPECT_GE(hi, 254) << c;
  }
}

TEST(ImageOpsTest, PosterizeSolarizeAndIdentity) {
  const RgbImage original = TestImage(8, 8, 9);
  RgbImage image = original, scratch;
  ApplyAugment({AugmentOp::kIdentity, 0}, {0, 0, 0}, image, &scratch);
  EXPECT_TRUE(SamePixels(image, original));
  ApplyAugment({AugmentOp::kPosterize, 3}, {0, 0, 0}, image, &scratch);
  for (size_t i = 0; i < image.pixels.size(); ++i) {
    EXPECT_EQ(image.pixels[i], original.pixels[i] & 0xE0);
  }
  image = original;
  ApplyAugment({AugmentOp::kSolarize, 0.5f}, {0, 0, 0}, image, &scratch);  // 127.5
  for (size_t i = 0; i < image.pixels.size(); ++i) {
    const uint8_t v = original.pixels[i];
    EXPECT_EQ(image.pixels[i], v >= 128 ? 255 - v : v);
  }
}

TEST(ImageOpsTest, TranslateShiftsAndFills) {
  const RgbImage original = TestImage(10, 6, 10);
  RgbImage image = original, scratch;
  ApplyAugment({AugmentOp::kTranslateX, 3.7f}, {9, 8, 7}, image, &scratch);  // int(3.7) = 3
  for (int y = 0; y < 6; ++y) {
    for (int x = 0; x < 10; ++x) {
      const uint8_t* got = At(image, x, y);
      if (x < 3) {
        EXPECT_EQ(got[0], 9);
        EXPECT_EQ(got[2], 7);
      } else {
        EXPECT_TRUE(std::equal(got, got + 3, At(original, x - 3, y))) << x << "," << y;
      }
    }
  }
  image = original;
  ApplyAugment({AugmentOp::kTranslateY, -2.0f}, {0, 0, 0}, image, &scratch);
  EXPECT_TRUE(std::equal(image.row(0), image.row(0) + 30, original.row(2)));
  EXPECT_TRUE(std::all_of(image.row(4), image.row(6), [](uint8_t v) { return v == 0; }));
}

TEST(ImageOpsTest, RotateByHalfTurnOfAnEvenImageIsBothFlips) {
  const RgbImage original = TestImage(8, 6, 11);
  RgbImage image = original, scratch;
  ApplyAugment({AugmentOp::kRotate, 180.0f}, {0, 0, 0}, image, &scratch);
  RgbImage flipped = original;
  HorizontalFlip(flipped);
  VerticalFlip(flipped);
  EXPECT_TRUE(SamePixels(image, flipped));
}

TEST(ImageOpsTest, ShearKeepsTheTopLeftCornerFixed) {
  const RgbImage original = TestImage(12, 10, 12);
  RgbImage image = original, scratch;
  ApplyAugment({AugmentOp::kShearX, 0.5f}, {0, 0, 0}, image, &scratch);
  // center=[0, 0]: row y moves by about -0.5 * (y + 0.5) pixels; row 0 is kept.
  EXPECT_TRUE(std::equal(image.row(0), image.row(0) + 36, original.row(0)));
  EXPECT_FALSE(SamePixels(image, original));
}

TEST(ImageOpsTest, SharpnessOneIsIdentityAndBordersStay) {
  const RgbImage original = TestImage(9, 7, 13);
  RgbImage image = original, scratch;
  ApplyAugment({AugmentOp::kSharpness, 0.0f}, {0, 0, 0}, image, &scratch);
  EXPECT_TRUE(SamePixels(image, original));
  ApplyAugment({AugmentOp::kSharpness, 0.9f}, {0, 0, 0}, image, &scratch);
  EXPECT_TRUE(std::equal(image.row(0), image.row(0) + 27, original.row(0)));
  EXPECT_TRUE(std::equal(image.row(6), image.row(6) + 27, original.row(6)));
  EXPECT_FALSE(SamePixels(image, original));
}

TEST(ImageOpsTest, TrivialAugmentDrawsAreDeterministicAndCoverEveryOp) {
  std::set<int> ops;
  std::set<float> shear_magnitudes;
  int negative = 0, signed_draws = 0;
  for (uint64_t seed = 0; seed < 4000; ++seed) {
    Rng a(MixSeed(42, seed)), b(MixSeed(42, seed));
    const AugmentParams p = SampleTrivialAugmentWide(31, a);
    const AugmentParams q = SampleTrivialAugmentWide(31, b);
    EXPECT_EQ(p.op, q.op);
    EXPECT_EQ(p.magnitude, q.magnitude);
    ops.insert(static_cast<int>(p.op));
    switch (p.op) {
      case AugmentOp::kIdentity:
      case AugmentOp::kAutoContrast:
      case AugmentOp::kEqualize:
        EXPECT_EQ(p.magnitude, 0.0f);
        break;
      case AugmentOp::kPosterize:
        EXPECT_GE(p.magnitude, 2.0f);
        EXPECT_LE(p.magnitude, 8.0f);
        break;
      case AugmentOp::kSolarize:
        EXPECT_GE(p.magnitude, 0.0f);
        EXPECT_LE(p.magnitude, 1.0f);
        break;
      case AugmentOp::kShearX:
        shear_magnitudes.insert(std::abs(p.magnitude));
        [[fallthrough]];
      default:
        ++signed_draws;
        negative += p.magnitude < 0;
        break;
    }
  }
  EXPECT_EQ(ops.size(), 14u);
  EXPECT_GT(shear_magnitudes.size(), 25u);  // most of the 31 bins
  EXPECT_NEAR(static_cast<double>(negative) / signed_draws, 0.5, 0.05);
  // The tables' ends: linspace(0, 0.99), (0, 32), (0, 135); Posterize 8..2; Solarize 1..0.
  EXPECT_EQ(TrivialAugmentMagnitude(AugmentOp::kShearX, 30, 31), 0.99f);
  EXPECT_EQ(TrivialAugmentMagnitude(AugmentOp::kTranslateY, 30, 31), 32.0f);
  EXPECT_EQ(TrivialAugmentMagnitude(AugmentOp::kRotate, 20, 31), 90.0f);
  EXPECT_EQ(TrivialAugmentMagnitude(AugmentOp::kPosterize, 0, 31), 8.0f);
  EXPECT_EQ(TrivialAugmentMagnitude(AugmentOp::kPosterize, 30, 31), 2.0f);
  EXPECT_EQ(TrivialAugmentMagnitude(AugmentOp::kSolarize, 0, 31), 1.0f);
  EXPECT_EQ(TrivialAugmentMagnitude(AugmentOp::kSolarize, 30, 31), 0.0f);
}

TEST(ImageOpsTest, ColorJitterOrderIsAPermutationAndFactorsInRange) {
  ColorJitterOptions options;
  options.has_brightness = options.has_saturation = options.has_hue = true;
  options.brightness[0] = 0.6f;
  options.brightness[1] = 1.4f;
  options.saturation[0] = 0.0f;
  options.saturation[1] = 2.0f;
  options.hue[0] = -0.1f;
  options.hue[1] = 0.1f;
  std::set<std::array<int, 4>> orders;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    Rng rng(MixSeed(7, seed)), again(MixSeed(7, seed));
    const ColorJitterParams p = SampleColorJitter(options, rng);
    const ColorJitterParams q = SampleColorJitter(options, again);
    EXPECT_EQ(p.order, q.order);
    std::array<int, 4> sorted = p.order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, (std::array<int, 4>{0, 1, 2, 3}));
    orders.insert(p.order);
    EXPECT_TRUE(p.apply[0] && !p.apply[1] && p.apply[2] && p.apply[3]);
    EXPECT_EQ(p.factor[1], 1.0f);  // unset: not drawn
    EXPECT_GE(p.factor[0], 0.6f);
    EXPECT_LE(p.factor[0], 1.4f);
    EXPECT_GE(p.factor[3], -0.1f);
    EXPECT_LE(p.factor[3], 0.1f);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(p.factor[i], q.factor[i]);
  }
  EXPECT_EQ(orders.size(), 24u);
}

TEST(ImageOpsTest, ColorJitterAppliesTheSetOpsInOrder) {
  const RgbImage original = TestImage(8, 8, 14);
  ColorJitterParams p;
  p.order = {3, 0, 2, 1};
  p.apply[0] = p.apply[2] = true;
  p.factor[0] = 1.3f;
  p.factor[2] = 0.4f;
  RgbImage got = original;
  ApplyColorJitter(p, got);
  RgbImage want = original;
  AdjustBrightness(want, 1.3f);
  AdjustSaturation(want, 0.4f);
  EXPECT_TRUE(SamePixels(got, want));
  RgbImage other_order = original;
  AdjustSaturation(other_order, 0.4f);
  AdjustBrightness(other_order, 1.3f);
  EXPECT_FALSE(SamePixels(got, other_order));  // the order matters, so it was honoured
}

TEST(ImageOpsTest, RandomErasingBoxesFitAndPZeroNeverErases) {
  RandomErasingOptions options;
  options.p = 1.0f;
  int erased = 0;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    Rng rng(MixSeed(3, seed)), again(MixSeed(3, seed));
    const ErasingParams e = SampleRandomErasing(options, 30, 50, rng);
    const ErasingParams f = SampleRandomErasing(options, 30, 50, again);
    EXPECT_EQ(e.erase, f.erase);
    EXPECT_EQ(e.top, f.top);
    EXPECT_EQ(e.left, f.left);
    if (!e.erase) continue;
    ++erased;
    EXPECT_GE(e.top, 0);
    EXPECT_GE(e.left, 0);
    EXPECT_LT(e.height, 30);
    EXPECT_LT(e.width, 50);
    EXPECT_LE(e.top + e.height, 30);
    EXPECT_LE(e.left + e.width, 50);
  }
  EXPECT_GT(erased, 1900);  // p = 1: only attempts that never fit give up
  options.p = 0.0f;
  for (uint64_t seed = 0; seed < 500; ++seed) {
    Rng rng(seed);
    EXPECT_FALSE(SampleRandomErasing(options, 30, 50, rng).erase);
  }
}

TEST(ImageOpsTest, EraseSetsExactlyTheBox) {
  const RgbImage original = TestImage(10, 8, 15);
  RgbImage image = original;
  ErasingParams e;
  e.erase = true;
  e.top = 2;
  e.left = 3;
  e.height = 4;
  e.width = 5;
  EraseU8(e, {1, 2, 3}, image);
  for (int y = 0; y < 8; ++y) {
    for (int x = 0; x < 10; ++x) {
      const bool inside = y >= 2 && y < 6 && x >= 3 && x < 8;
      const uint8_t* got = At(image, x, y);
      if (inside) {
        EXPECT_EQ(got[0], 1);
        EXPECT_EQ(got[1], 2);
        EXPECT_EQ(got[2], 3);
      } else {
        EXPECT_TRUE(std::equal(got, got + 3, At(original, x, y)));
      }
    }
  }
  e.erase = false;
  RgbImage untouched = original;
  EraseU8(e, {1, 2, 3}, untouched);
  EXPECT_TRUE(SamePixels(untouched, original));
}

}  // namespace
}  // namespace ferry
