// Agreement of image_ops.h with torchvision: testing/data/torchvision_ops holds uint8 images
// and torchvision's outputs for fixed parameters (written by
// testing/make_torchvision_references.py with torchvision 0.26's v2 functional ops), and every
// case here runs the same op with the same parameters and compares pixel by pixel.
//
// Tolerances: exact (no byte differs) for every op but ResizeBilinear, which may differ by one
// level on up to kResizeMismatchFraction of the pixels: ferry's resampler
// (internal/resample.h) rounds with 14-bit fixed-point weights, torch's uint8 antialias path
// with a precision it picks per filter, so a few sums round to the other side. A wrong filter
// or a missing antialias differs by far more.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/decode/image_ops.h"

namespace ferry {
namespace {

#ifndef FERRY_TORCHVISION_OPS_DIR
#error "FERRY_TORCHVISION_OPS_DIR must name testing/data/torchvision_ops"
#endif

// Share of pixels ResizeBilinear may have one level off torchvision's.
constexpr double kResizeMismatchFraction = 0.10;

std::string DataDir() {
  // An override for checking other references (e.g. from another torchvision) by hand.
  const char* dir = std::getenv("FERRY_TORCHVISION_OPS_DIR");
  return dir != nullptr ? dir : FERRY_TORCHVISION_OPS_DIR;
}

struct Entry {
  std::string kind;  // input, table or case
  std::map<std::string, std::string> fields;
  std::string line;
};

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, sep)) out.push_back(part);
  return out;
}

double ParseDouble(const std::string& s) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);  // also reads Python's float.hex()
  EXPECT_TRUE(errno == 0 && end != s.c_str() && *end == '\0') << "not a number: " << s;
  return v;
}

int ParseInt(const std::string& s) { return static_cast<int>(ParseDouble(s)); }

class TorchvisionOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = DataDir();
    std::ifstream manifest(dir + "/manifest.txt");
    ASSERT_TRUE(manifest) << "cannot read " << dir << "/manifest.txt";
    std::string line;
    while (std::getline(manifest, line)) {
      if (line.empty()) continue;
      if (line[0] == '#') {
        header_ += line + "\n";
        continue;
      }
      Entry e;
      e.line = line;
      std::vector<std::string> tokens = Split(line, ' ');
      e.kind = tokens[0];
      for (size_t i = 1; i < tokens.size(); ++i) {
        const size_t eq = tokens[i].find('=');
        ASSERT_NE(eq, std::string::npos) << line;
        e.fields[tokens[i].substr(0, eq)] = tokens[i].substr(eq + 1);
      }
      entries_.push_back(std::move(e));
    }
    std::ifstream bin(dir + "/ops.bin", std::ios::binary);
    ASSERT_TRUE(bin) << "cannot read " << dir << "/ops.bin";
    blob_.assign(std::istreambuf_iterator<char>(bin), std::istreambuf_iterator<char>());
    for (const Entry& e : entries_) {
      if (e.kind == "input") inputs_[e.fields.at("name")] = Image(e);
    }
    ASSERT_FALSE(inputs_.empty());
  }

  // The image an entry's size and offset name in ops.bin.
  RgbImage Image(const Entry& e) {
    std::vector<std::string> size = Split(e.fields.at("size"), 'x');
    RgbImage image;
    image.Resize(ParseInt(size[1]), ParseInt(size[0]));
    const size_t offset = static_cast<size_t>(ParseDouble(e.fields.at("offset")));
    EXPECT_LE(offset + image.pixels.size(), blob_.size()) << e.line;
    if (offset + image.pixels.size() <= blob_.size()) {
      std::copy_n(blob_.begin() + static_cast<std::ptrdiff_t>(offset), image.pixels.size(),
                  image.pixels.begin());
    }
    return image;
  }

  std::string header_;
  std::vector<Entry> entries_;
  std::string blob_;
  std::map<std::string, RgbImage> inputs_;
};

const std::map<std::string, AugmentOp>& AugmentOpsByName() {
  static const auto* ops = new std::map<std::string, AugmentOp>{
      {"Identity", AugmentOp::kIdentity},
      {"ShearX", AugmentOp::kShearX},
      {"ShearY", AugmentOp::kShearY},
      {"TranslateX", AugmentOp::kTranslateX},
      {"TranslateY", AugmentOp::kTranslateY},
      {"Rotate", AugmentOp::kRotate},
      {"Brightness", AugmentOp::kBrightness},
      {"Color", AugmentOp::kColor},
      {"Contrast", AugmentOp::kContrast},
      {"Sharpness", AugmentOp::kSharpness},
      {"Posterize", AugmentOp::kPosterize},
      {"Solarize", AugmentOp::kSolarize},
      {"AutoContrast", AugmentOp::kAutoContrast},
      {"Equalize", AugmentOp::kEqualize},
  };
  return *ops;
}

PaddingMode ParsePaddingMode(const std::string& s) {
  if (s == "edge") return PaddingMode::kEdge;
  if (s == "reflect") return PaddingMode::kReflect;
  if (s == "symmetric") return PaddingMode::kSymmetric;
  EXPECT_EQ(s, "constant");
  return PaddingMode::kConstant;
}

// Runs a case's op on its input; `label` names the op for the tolerance table.
RgbImage RunOp(const std::string& op, const std::vector<std::string>& a, RgbImage image,
               std::string* label) {
  *label = op;
  RgbImage out;
  if (op == "hflip") {
    HorizontalFlip(image);
  } else if (op == "vflip") {
    VerticalFlip(image);
  } else if (op == "grayscale") {
    RgbToGrayscale(image);
  } else if (op == "pad") {
    const std::array<uint8_t, 3> fill = {static_cast<uint8_t>(ParseInt(a[5])),
                                         static_cast<uint8_t>(ParseInt(a[6])),
                                         static_cast<uint8_t>(ParseInt(a[7]))};
    Pad(image, ParseInt(a[0]), ParseInt(a[1]), ParseInt(a[2]), ParseInt(a[3]),
        ParsePaddingMode(a[4]), fill, &out);
    *label = "pad " + a[4];
    return out;
  } else if (op == "crop") {
    Crop(image, ParseInt(a[0]), ParseInt(a[1]), ParseInt(a[2]), ParseInt(a[3]), &out);
    return out;
  } else if (op == "resize") {
    ResizeBilinear(image, ParseInt(a[0]), ParseInt(a[1]), &out);
    return out;
  } else if (op == "brightness") {
    AdjustBrightness(image, static_cast<float>(ParseDouble(a[0])));
  } else if (op == "contrast") {
    AdjustContrast(image, static_cast<float>(ParseDouble(a[0])));
  } else if (op == "saturation") {
    AdjustSaturation(image, static_cast<float>(ParseDouble(a[0])));
  } else if (op == "hue") {
    AdjustHue(image, static_cast<float>(ParseDouble(a[0])));
  } else if (op == "erase") {
    ErasingParams p;
    p.erase = true;
    p.top = ParseInt(a[0]);
    p.left = ParseInt(a[1]);
    p.height = ParseInt(a[2]);
    p.width = ParseInt(a[3]);
    EraseU8(p,
            {static_cast<uint8_t>(ParseInt(a[4])), static_cast<uint8_t>(ParseInt(a[5])),
             static_cast<uint8_t>(ParseInt(a[6]))},
            image);
  } else if (op == "augment") {
    AugmentParams p;
    p.op = AugmentOpsByName().at(a[0]);
    p.magnitude = static_cast<float>(ParseDouble(a[1]));
    RgbImage scratch;
    ApplyAugment(p, {0, 0, 0}, image, &scratch);
    *label = "augment " + a[0];
  } else {
    ADD_FAILURE() << "unknown op " << op;
  }
  return image;
}

TEST_F(TorchvisionOpsTest, EveryCaseAgrees) {
  std::printf("references: %s", header_.c_str());
  struct Stats {
    int cases = 0, max_diff = 0;
    double max_mismatch_fraction = 0;
  };
  std::map<std::string, Stats> stats;
  int cases = 0;
  for (const Entry& e : entries_) {
    if (e.kind != "case") continue;
    ++cases;
    SCOPED_TRACE(e.line);
    const std::string& args = e.fields.at("args");
    std::string label;
    const RgbImage got =
        RunOp(e.fields.at("op"), args == "-" ? std::vector<std::string>{} : Split(args, ','),
              inputs_.at(e.fields.at("in")), &label);
    const RgbImage want = Image(e);
    ASSERT_EQ(got.width, want.width);
    ASSERT_EQ(got.height, want.height);
    int max_diff = 0;
    size_t mismatched_pixels = 0;
    for (size_t i = 0; i < got.pixels.size(); i += 3) {
      bool differs = false;
      for (int c = 0; c < 3; ++c) {
        const int d = std::abs(got.pixels[i + c] - want.pixels[i + c]);
        max_diff = std::max(max_diff, d);
        differs |= d != 0;
      }
      mismatched_pixels += differs;
    }
    const double fraction =
        static_cast<double>(mismatched_pixels) / static_cast<double>(got.pixels.size() / 3);
    Stats& s = stats[label];
    ++s.cases;
    s.max_diff = std::max(s.max_diff, max_diff);
    s.max_mismatch_fraction = std::max(s.max_mismatch_fraction, fraction);
    if (label == "resize") {
      EXPECT_LE(max_diff, 1);
      EXPECT_LE(fraction, kResizeMismatchFraction) << mismatched_pixels << " pixels differ";
    } else {
      EXPECT_EQ(max_diff, 0) << mismatched_pixels << " pixels differ";
    }
  }
  EXPECT_GE(cases, 50) << "too few cases in the manifest";
  for (const auto& [label, s] : stats) {
    std::printf("%-22s %3d cases  max |diff| %3d  pixels differing at most %.4f%%\n", label.c_str(),
                s.cases, s.max_diff, 100 * s.max_mismatch_fraction);
  }
}

// The magnitudes of every bin equal torchvision's (float32) tables.
TEST_F(TorchvisionOpsTest, TrivialAugmentMagnitudeTables) {
  int tables = 0;
  for (const Entry& e : entries_) {
    if (e.kind != "table") continue;
    ++tables;
    SCOPED_TRACE(e.fields.at("op"));
    const AugmentOp op = AugmentOpsByName().at(e.fields.at("op"));
    const std::vector<std::string> values = Split(e.fields.at("values"), ',');
    const int bins = static_cast<int>(values.size());
    for (int b = 0; b < bins; ++b) {
      EXPECT_EQ(TrivialAugmentMagnitude(op, b, bins), static_cast<float>(ParseDouble(values[b])))
          << "bin " << b;
    }
  }
  EXPECT_EQ(tables, 11);  // every op but Identity, AutoContrast and Equalize
}

}  // namespace
}  // namespace ferry
