#include "server/decode/compose.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/kernels/photometric.h"
#include "testing/jpeg_writer.h"
#include "testing/png_writer.h"

namespace ferry {
namespace {

using Kind = ComposeStep::Kind;
using ::testing::HasSubstr;

ComposeStep Step(Kind kind, int size = 0) {
  ComposeStep s;
  s.kind = kind;
  s.size = size;
  return s;
}

ComposeStep Jitter() {
  ComposeStep s = Step(Kind::kColorJitter);
  s.jitter.has_brightness = s.jitter.has_contrast = s.jitter.has_saturation = true;
  s.jitter.has_hue = true;
  s.jitter.brightness[0] = s.jitter.contrast[0] = s.jitter.saturation[0] = 0.6f;
  s.jitter.brightness[1] = s.jitter.contrast[1] = s.jitter.saturation[1] = 1.4f;
  s.jitter.hue[0] = -0.1f;
  s.jitter.hue[1] = 0.1f;
  return s;
}

ComposeStep Normalize() {
  ComposeStep s = Step(Kind::kNormalize);
  const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  std::copy(mean, mean + 3, s.mean);
  std::copy(std, std + 3, s.std);
  return s;
}

ComposedTransform Make(std::vector<ComposeStep> steps, bool device = false) {
  ComposedTransform::Target target;
  target.device_program = device;
  absl::StatusOr<ComposedTransform> t = ComposedTransform::Create(std::move(steps), target);
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

absl::Status CreateError(std::vector<ComposeStep> steps, bool device = false) {
  ComposedTransform::Target target;
  target.device_program = device;
  return ComposedTransform::Create(std::move(steps), target).status();
}

// An 8-bit RGB PNG of a test pattern: lossless, so pixel expectations are exact.
std::vector<uint8_t> Png(int width, int height, uint64_t seed) {
  const std::vector<uint8_t> rgb = testutil::MakeTestPattern(width, height, seed);
  return testutil::EncodePng(std::vector<uint16_t>(rgb.begin(), rgb.end()), width, height,
                             testutil::PngEncodeOptions{});
}

struct Output {
  std::vector<uint8_t> image;
  PhotometricProgram program;
};

Output Apply(const ComposedTransform& t, const std::vector<uint8_t>& bytes, uint64_t seed) {
  ImageDecoder decoder;
  ComposeScratch scratch;
  Output out;
  out.image.resize(t.image_row_bytes());
  std::vector<uint8_t> program(t.emits_program() ? sizeof(PhotometricProgram) : 0);
  const absl::Status s =
      t.Run(decoder, bytes, seed, scratch, absl::MakeSpan(out.image), absl::MakeSpan(program));
  EXPECT_TRUE(s.ok()) << s;
  if (!program.empty()) std::memcpy(&out.program, program.data(), program.size());
  return out;
}

std::vector<float> AsFloats(const std::vector<uint8_t>& bytes) {
  std::vector<float> f(bytes.size() / 4);
  std::memcpy(f.data(), bytes.data(), bytes.size());
  return f;
}

TEST(ComposeTest, RefusesWhatCannotRunNamingTheOp) {
  EXPECT_THAT(CreateError({}).message(), HasSubstr("ops is empty"));
  EXPECT_THAT(CreateError({Step(Kind::kResize, 64)}).message(),
              HasSubstr("output size depends on each image"));
  EXPECT_THAT(CreateError({Step(Kind::kCenterCrop, 64), Normalize(), Jitter()}).message(),
              HasSubstr("ops[2] (ColorJitter): comes after Normalize (ops[1])"));
  ComposeStep flip = Step(Kind::kHorizontalFlip);
  flip.p = 1.5f;
  EXPECT_THAT(CreateError({Step(Kind::kCenterCrop, 8), flip}).message(),
              HasSubstr("ops[1] (RandomHorizontalFlip): p must be in [0, 1]"));
  EXPECT_THAT(CreateError({Step(Kind::kCenterCrop, 0)}).message(),
              HasSubstr("ops[0] (CenterCrop): size must be in [1, 16384]"));
  ComposeStep bad_std = Normalize();
  bad_std.std[1] = 0;
  EXPECT_THAT(CreateError({Step(Kind::kCenterCrop, 8), bad_std}).message(),
              HasSubstr("ops[1] (Normalize): std must be positive"));
  // Four jitters of up to 4 ops each and a Normalize overflow a device program.
  EXPECT_THAT(CreateError({Step(Kind::kCenterCrop, 8), Jitter(), Jitter(), Jitter(), Jitter()},
                          /*device=*/true)
                  .message(),
              HasSubstr("at most 15 fit"));
  // A Resize after a fixed crop keeps the size fixed.
  EXPECT_TRUE(CreateError({Step(Kind::kCenterCrop, 64), Step(Kind::kResize, 32)}).ok());
}

TEST(ComposeTest, PlansWhereEachOpRuns) {
  const ComposedTransform cpu =
      Make({Step(Kind::kRandomResizedCrop, 32), Jitter(), Normalize()}, /*device=*/false);
  EXPECT_TRUE(cpu.float_output());
  EXPECT_FALSE(cpu.emits_program());
  EXPECT_EQ(cpu.image_row_bytes(), 32u * 32 * 3 * 4);

  const ComposedTransform gpu = Make(
      {Step(Kind::kRandomResizedCrop, 32), Step(Kind::kTrivialAugmentWide), Jitter(), Normalize()},
      /*device=*/true);
  EXPECT_FALSE(gpu.float_output());
  EXPECT_TRUE(gpu.emits_program());
  EXPECT_EQ(gpu.device_steps(), 2);
  EXPECT_EQ(gpu.image_row_bytes(), 32u * 32 * 3);

  // A photometric op before a CPU op runs on the CPU too.
  const ComposedTransform mixed =
      Make({Step(Kind::kCenterCrop, 16), Jitter(), Step(Kind::kVerticalFlip)}, /*device=*/true);
  EXPECT_EQ(mixed.device_steps(), 3);  // nothing but the appended Normalize
}

TEST(ComposeTest, LeadingRandomResizedCropIsTheFusedDecodeWithOpZerosDraws) {
  const std::vector<uint8_t> jpeg =
      testutil::EncodeJpeg(testutil::MakeTestPattern(300, 200, 3).data(), 300, 200, 90);
  const ComposedTransform t = Make({Step(Kind::kRandomResizedCrop, 48)});
  for (uint64_t seed = 0; seed < 8; ++seed) {
    ImageDecoder decoder;
    std::vector<uint8_t> expected(48 * 48 * 3);
    Rng rng(MixSeed(seed, 0));
    ASSERT_TRUE(DecodeAndTransform(decoder, jpeg, ImageTransform::RandomResizedCrop(48, false), rng,
                                   absl::MakeSpan(expected))
                    .ok());
    EXPECT_EQ(Apply(t, jpeg, seed).image, expected) << "seed " << seed;
  }
}

TEST(ComposeTest, SameSeedSameOutputAndEachOpHasItsOwnDraws) {
  const std::vector<uint8_t> png = Png(64, 48, 5);
  const ComposedTransform t =
      Make({Step(Kind::kRandomResizedCrop, 24), Step(Kind::kHorizontalFlip),
            Step(Kind::kTrivialAugmentWide), Jitter(), Step(Kind::kRandomGrayscale), Normalize()});
  const std::vector<uint8_t> a = Apply(t, png, 42).image;
  EXPECT_EQ(Apply(t, png, 42).image, a);
  EXPECT_NE(Apply(t, png, 43).image, a);

  // Op i draws from MixSeed(seed, i) alone: appending an op leaves the earlier ops' results
  // alone, and a flip at position 1 flips exactly when its own draw says so.
  const ComposedTransform crop = Make({Step(Kind::kCenterCrop, 24)});
  const ComposedTransform crop_flip =
      Make({Step(Kind::kCenterCrop, 24), Step(Kind::kHorizontalFlip)});
  int flipped = 0;
  for (uint64_t seed = 0; seed < 64; ++seed) {
    const std::vector<uint8_t> plain = Apply(crop, png, seed).image;
    const std::vector<uint8_t> maybe = Apply(crop_flip, png, seed).image;
    Rng rng(MixSeed(seed, 1));
    if (rng.Uniform() < 0.5) {
      ++flipped;
      RgbImage img{24, 24, plain};
      HorizontalFlip(img);
      EXPECT_EQ(maybe, img.pixels) << seed;
    } else {
      EXPECT_EQ(maybe, plain) << seed;
    }
  }
  EXPECT_GT(flipped, 16);
  EXPECT_LT(flipped, 48);
}

TEST(ComposeTest, CpuNormalizeIsToDtypeThenNormalizeInChw) {
  const std::vector<uint8_t> png = Png(40, 30, 9);
  const ComposedTransform u8 = Make({Step(Kind::kCenterCrop, 16), Jitter()});
  const ComposedTransform f32 = Make({Step(Kind::kCenterCrop, 16), Jitter(), Normalize()});
  const ComposeStep n = Normalize();
  for (uint64_t seed = 0; seed < 4; ++seed) {
    const std::vector<uint8_t> pixels = Apply(u8, png, seed).image;
    const std::vector<float> chw = AsFloats(Apply(f32, png, seed).image);
    ASSERT_EQ(chw.size(), 3u * 16 * 16);
    for (int c = 0; c < 3; ++c) {
      for (int p = 0; p < 16 * 16; ++p) {
        const float expected = (pixels[p * 3 + c] / 255.0f - n.mean[c]) / n.std[c];
        ASSERT_NEAR(chw[c * 256 + p], expected, 1e-5) << "c " << c << " p " << p;
      }
    }
  }
}

TEST(ComposeTest, ErasingAfterNormalizeWritesTheValueInNormalizedUnits) {
  const std::vector<uint8_t> png = Png(40, 40, 2);
  ComposeStep erase = Step(Kind::kRandomErasing);
  erase.erasing.p = 1.0f;
  erase.value[0] = erase.value[1] = erase.value[2] = -7.0f;  // impossible otherwise
  const ComposedTransform t = Make({Step(Kind::kCenterCrop, 32), Normalize(), erase});
  for (uint64_t seed = 0; seed < 8; ++seed) {
    const std::vector<float> chw = AsFloats(Apply(t, png, seed).image);
    Rng rng(MixSeed(seed, 2));
    const ErasingParams e = SampleRandomErasing(erase.erasing, 32, 32, rng);
    ASSERT_TRUE(e.erase);
    int erased = 0;
    for (float v : chw) erased += v == -7.0f;
    EXPECT_EQ(erased, 3 * e.height * e.width) << seed;
    EXPECT_EQ(chw[e.top * 32 + e.left], -7.0f);
  }
}

TEST(ComposeTest, RandomCropPadsThenCropsAsTorchvision) {
  // CIFAR's RandomCrop(32, padding=4): the padding shows as zero borders whose widths are
  // the draws (top, then left) from op 0's stream.
  const std::vector<uint8_t> png = Png(32, 32, 4);
  ComposeStep rc = Step(Kind::kRandomCrop, 32);
  for (int& p : rc.padding) p = 4;
  const ComposedTransform t = Make({rc});
  ImageDecoder decoder;
  std::vector<uint8_t> original;
  int w = 0, h = 0;
  ASSERT_TRUE(decoder.DecodeRgb(png, &original, &w, &h).ok());
  for (uint64_t seed = 0; seed < 16; ++seed) {
    const std::vector<uint8_t> out = Apply(t, png, seed).image;
    Rng rng(MixSeed(seed, 0));
    const int top = static_cast<int>(rng.Below(9)), left = static_cast<int>(rng.Below(9));
    for (int y = 0; y < 32; ++y) {
      for (int x = 0; x < 32; ++x) {
        const int sy = y + top - 4, sx = x + left - 4;
        const bool inside = sy >= 0 && sy < 32 && sx >= 0 && sx < 32;
        for (int c = 0; c < 3; ++c) {
          const uint8_t expected = inside ? original[(sy * 32 + sx) * 3 + c] : 0;
          ASSERT_EQ(out[(y * 32 + x) * 3 + c], expected) << seed << " " << x << "," << y;
        }
      }
    }
  }
  // Too small without pad_if_needed: a clear per-sample error.
  const ComposedTransform big = Make({Step(Kind::kRandomCrop, 40)});
  ImageDecoder d;
  ComposeScratch scratch;
  std::vector<uint8_t> row(40 * 40 * 3);
  const absl::Status s = big.Run(d, png, 0, scratch, absl::MakeSpan(row), {});
  EXPECT_THAT(s.message(), HasSubstr("smaller than size 40; set pad_if_needed"));
  ComposeStep padded = Step(Kind::kRandomCrop, 40);
  padded.pad_if_needed = true;
  EXPECT_EQ(Apply(Make({padded}), png, 0).image.size(), 40u * 40 * 3);
}

// A 1 x 65,500 panorama (17 KB as a file) under ops whose intermediates would be many GB:
// each is a bad sample with a clear reason, refused before anything is allocated. The
// ordinary use of the same ops on the same image still runs.
TEST(ComposeTest, NoStepMakesAnImageLargerThanTheSampleBound) {
  const std::vector<uint8_t> panorama = Png(65500, 1, 3);
  ComposeStep crop = Step(Kind::kRandomCrop, 224);
  crop.pad_if_needed = true;
  struct Case {
    std::vector<ComposeStep> steps;
    std::string says;
    std::string bound;  // the larger of max_image_pixels and the output's pixels
  };
  ComposeStep huge_pad = Step(Kind::kRandomCrop, 16384);
  for (int& p : huge_pad.padding) p = 16384;
  const std::vector<Case> cases = {
      {{Step(Kind::kResize, 16384), crop, Step(Kind::kHorizontalFlip)},
       "Resize(16384) would turn this 65500x1 image into 1073152000x16384",
       "89478485"},
      {{Step(Kind::kResize, 256), crop},
       "Resize(256) would turn this 65500x1 image into 16768000x256 (4292608000 pixels)",
       "89478485"},
      {{huge_pad},
       "RandomCrop's padding would turn this 65500x1 image into 98268x32769",
       "268435456"},
  };
  for (const Case& c : cases) {
    ComposedTransform t = Make(c.steps);
    ImageDecoder decoder;
    ComposeScratch scratch;
    std::vector<uint8_t> row(t.image_row_bytes());
    const absl::Status s = t.Run(decoder, panorama, 0, scratch, absl::MakeSpan(row), {});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.says));
    EXPECT_THAT(s.message(),
                HasSubstr("more than the " + c.bound + " any step of a transform may make"));
    EXPECT_LT(scratch.image.pixels.capacity() + scratch.other.pixels.capacity(), 1u << 20);
  }
  // A lower max_image_pixels lowers the bound (a 300x200 photo resized to 384x256 is over
  // 70,000 pixels); an output of more pixels than it is always allowed.
  ImageDecoder strict;
  strict.set_limits(DecodeLimits{.max_image_pixels = 70000});
  const std::vector<uint8_t> photo = Png(300, 200, 5);
  ComposeScratch scratch;
  // (A flip first: Resize + CenterCrop at the start would be fused into the decode.)
  const ComposedTransform resize =
      Make({Step(Kind::kHorizontalFlip), Step(Kind::kResize, 256), Step(Kind::kCenterCrop, 224)});
  std::vector<uint8_t> row(resize.image_row_bytes());
  EXPECT_THAT(resize.Run(strict, photo, 0, scratch, absl::MakeSpan(row), {}).message(),
              HasSubstr("into 384x256 (98304 pixels), more than the 70000"));
  EXPECT_TRUE(Apply(resize, photo, 0).image.size() == row.size());  // default limits
  const ComposedTransform big = Make({Step(Kind::kCenterCrop, 300)});
  row.resize(big.image_row_bytes());
  EXPECT_TRUE(big.Run(strict, photo, 0, scratch, absl::MakeSpan(row), {}).ok());
}

TEST(ComposeTest, CenterCropOfASmallerImagePadsWithZeros) {
  const std::vector<uint8_t> png = Png(10, 6, 1);
  const std::vector<uint8_t> out = Apply(Make({Step(Kind::kCenterCrop, 12)}), png, 0).image;
  // Padding: left 1, right 1, top 3, bottom 3.
  EXPECT_EQ(out[0], 0);
  EXPECT_NE(out[(3 * 12 + 1) * 3], 0);  // the pattern's values lie in [16, 239]
  EXPECT_EQ(out[(3 * 12 + 0) * 3], 0);
  EXPECT_EQ(out[(9 * 12 + 5) * 3], 0);
}

TEST(ComposeTest, DeviceProgramHoldsTheDrawsOfTheTrailingOps) {
  const std::vector<uint8_t> png = Png(48, 48, 8);
  ComposeStep gray = Step(Kind::kRandomGrayscale);
  gray.p = 0.5f;
  ComposeStep erase = Step(Kind::kRandomErasing);
  erase.erasing.p = 1.0f;
  erase.value[0] = 1.5f;
  const std::vector<ComposeStep> steps = {Step(Kind::kCenterCrop, 32), Jitter(), gray, Normalize(),
                                          erase};
  const ComposedTransform gpu = Make(steps, /*device=*/true);
  const ComposedTransform crop = Make({Step(Kind::kCenterCrop, 32)});
  for (uint64_t seed = 0; seed < 16; ++seed) {
    const Output out = Apply(gpu, png, seed);
    EXPECT_EQ(out.image, Apply(crop, png, seed).image);  // the CPU did only the crop
    Rng jitter_rng(MixSeed(seed, 1));
    const ColorJitterParams jp = SampleColorJitter(steps[1].jitter, jitter_rng);
    const PhotometricProgram& p = out.program;
    uint32_t i = 0;
    for (int k : jp.order) {
      ASSERT_LT(i, p.num_ops);
      EXPECT_EQ(p.ops[i].kind, static_cast<uint32_t>(k + 1));  // kBrightness..kHue
      EXPECT_EQ(p.ops[i].a, jp.factor[k]);
      ++i;
    }
    Rng gray_rng(MixSeed(seed, 2));
    if (gray_rng.Uniform() < 0.5) {
      EXPECT_EQ(p.ops[i++].kind, static_cast<uint32_t>(PhotometricKind::kGrayscale));
    }
    EXPECT_EQ(p.ops[i].kind, static_cast<uint32_t>(PhotometricKind::kNormalize));
    EXPECT_EQ(p.ops[i++].w[2], 0.225f);
    Rng erase_rng(MixSeed(seed, 4));
    const ErasingParams e = SampleRandomErasing(erase.erasing, 32, 32, erase_rng);
    ASSERT_EQ(p.ops[i].kind, static_cast<uint32_t>(PhotometricKind::kErase));
    EXPECT_EQ(p.ops[i].top, e.top);
    EXPECT_EQ(p.ops[i].width, e.width);
    EXPECT_EQ(p.ops[i].v[0], 1.5f);  // after Normalize: normalized units, as given
    EXPECT_EQ(p.num_ops, i + 1);
  }
  // No Normalize among the ops: the job's image_output normalisation is appended.
  const Output plain = Apply(Make({Step(Kind::kCenterCrop, 32)}, /*device=*/true), png, 0);
  ASSERT_EQ(plain.program.num_ops, 1u);
  EXPECT_EQ(plain.program.ops[0].kind, static_cast<uint32_t>(PhotometricKind::kNormalize));
  EXPECT_EQ(plain.program.ops[0].v[0], 0.485f);
}

}  // namespace
}  // namespace ferry
