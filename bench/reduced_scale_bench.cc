// What reduced-scale JPEG decoding changes and what it saves, per DCT scale.
//
//   reduced_scale_bench DIR [DIR...] [--size 224] [--crops 16] [--repeat 3]
//
// For every JPEG under each DIR (one group per DIR, e.g. photographs and detailed images):
//   1. pixels: `crops` RandomResizedCrop(size) crops of each file (torchvision's default
//      scale and ratio), and as many at size / 4 (so that small photographs reach every
//      scale), each decoded at every scale down to 1/8 (smallest_dct_scale 1), held at 1/2
//      (the default) and with full_decode; for the crops that allow a reduced DCT scale,
//      grouped by that scale (1/2, 1/4, 1/8): the mean absolute difference from full_decode
//      per file (over every channel of every pixel of its crops), the worst file's, and the
//      largest pixel difference, in grey levels;
//   2. speed: RandomResizedCrop(size) + flip with torchvision's default scale and ratio,
//      single thread, `repeat` passes over the files: images/s at every scale, held at 1/2
//      (the default), and with full_decode.
// Ratios are printed against full_decode (the baseline every other loader decodes at).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/random.h"
#include "server/decode/image_transform.h"

namespace {

using ferry::ImageDecoder;
using ferry::ImageTransform;
using Clock = std::chrono::steady_clock;

struct File {
  std::string name;
  std::vector<uint8_t> bytes;
  int width = 0, height = 0;
};

std::vector<File> ReadJpegs(const std::string& root) {
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    std::string ext = e.path().extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
    if (e.is_regular_file() && (ext == ".jpg" || ext == ".jpeg")) paths.push_back(e.path());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<File> files;
  ImageDecoder decoder;
  for (const auto& p : paths) {
    std::ifstream in(p, std::ios::binary);
    File f;
    f.name = std::filesystem::path(p).filename();
    f.bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    std::vector<uint8_t> rgb;
    if (!decoder.DecodeRgb(f.bytes, &rgb, &f.width, &f.height).ok()) {
      std::fprintf(stderr, "reduced_scale_bench: %s is not a JPEG ferry decodes\n", p.c_str());
      std::exit(1);
    }
    files.push_back(std::move(f));
  }
  return files;
}

std::vector<uint8_t> Run(ImageDecoder& decoder, const File& f, const ImageTransform& t,
                         uint64_t seed) {
  std::vector<uint8_t> out(static_cast<size_t>(t.size) * t.size * 3);
  ferry::Rng rng(seed);
  if (!ferry::DecodeAndTransform(decoder, f.bytes, t, rng, absl::MakeSpan(out)).ok()) {
    std::fprintf(stderr, "reduced_scale_bench: %s failed to decode\n", f.name.c_str());
    std::exit(1);
  }
  return out;
}

// Per DCT scale: how the default's crops differ from full_decode's, per file.
struct ScaleStats {
  std::map<std::string, std::pair<double, int64_t>> file_sums;  // sum of |diff|, values
  // The same crops with the smallest scale held at 1/2 (for scales below it).
  std::map<std::string, std::pair<double, int64_t>> held_sums;
  int held_worst_pixel = 0;
  int64_t crops = 0;
  int worst_pixel = 0;
};

// Adds |a - b| over every value to *sum (first: the total, second: the values counted) and
// raises *worst to the largest.
void Accumulate(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                std::pair<double, int64_t>* sum, int* worst) {
  for (size_t i = 0; i < b.size(); ++i) {
    const int d = std::abs(static_cast<int>(a[i]) - static_cast<int>(b[i]));
    sum->first += d;
    *worst = std::max(*worst, d);
  }
  sum->second += static_cast<int64_t>(b.size());
}

void Pixels(const std::vector<File>& files, int size, int crops) {
  ImageDecoder decoder;
  std::map<int, ScaleStats> by_scale;
  for (const File& f : files) {
    for (int c = 0; c < crops; ++c) {
      ImageTransform t = ImageTransform::RandomResizedCrop(size, false);
      t.smallest_dct_scale = 1;  // every scale down to 1/8: the scale each crop allows
      const uint64_t seed = ferry::MixSeed(7, c);
      ferry::Rng plan(seed);
      const int n = ferry::JpegDctScale(ferry::PlanSourceWindow(f.width, f.height, t, plan), t);
      if (n == 8) continue;  // the default decodes this crop at full resolution too
      const std::vector<uint8_t> scaled = Run(decoder, f, t, seed);
      ImageTransform held_t = t;
      held_t.smallest_dct_scale = 4;
      const std::vector<uint8_t> held = Run(decoder, f, held_t, seed);
      t.full_decode = true;
      const std::vector<uint8_t> full = Run(decoder, f, t, seed);
      ScaleStats& s = by_scale[n];
      Accumulate(held, full, &s.held_sums[f.name], &s.held_worst_pixel);
      Accumulate(scaled, full, &s.file_sums[f.name], &s.worst_pixel);
      ++s.crops;
    }
  }
  std::printf("  RandomResizedCrop(%d), %d crops a file, the crops that allow a reduced scale:\n",
              size, crops);
  std::printf("  %-6s %6s %6s %22s %12s %12s   %s\n", "scale", "files", "crops",
              "every scale: mean |diff| per file", "worst file", "worst pixel",
              "held at 1/2: mean, worst file, worst pixel");
  for (int n : {4, 2, 1}) {
    auto it = by_scale.find(n);
    if (it == by_scale.end()) continue;
    const ScaleStats& s = it->second;
    auto summary = [](const std::map<std::string, std::pair<double, int64_t>>& sums) {
      double total = 0, worst = 0;
      for (const auto& [name, sv] : sums) {
        const double mean = sv.first / static_cast<double>(sv.second);
        total += mean;
        worst = std::max(worst, mean);
      }
      return std::pair{total / static_cast<double>(sums.size()), worst};
    };
    const auto [mean, worst] = summary(s.file_sums);
    std::printf("  1/%-4d %6zu %6lld %22.3f %12.3f %12d", 8 / n, s.file_sums.size(),
                static_cast<long long>(s.crops), mean, worst, s.worst_pixel);
    if (n < 4) {
      const auto [held_mean, held_worst] = summary(s.held_sums);
      std::printf("   %.3f, %.3f, %d", held_mean, held_worst, s.held_worst_pixel);
    }
    std::printf("\n");
  }
}

void Speed(const std::vector<File>& files, int size, int repeat) {
  ImageDecoder decoder;
  struct Mode {
    const char* name;
    bool full_decode;
    int smallest;
  };
  const Mode modes[] = {
      {"full_decode", true, 8}, {"held at 1/2", false, 4}, {"every scale", false, 1}};
  double full_rate = 0;
  for (const Mode& m : modes) {
    ImageTransform t = ImageTransform::RandomResizedCrop(size, true);
    t.full_decode = m.full_decode;
    t.smallest_dct_scale = m.smallest;
    std::vector<uint8_t> out(static_cast<size_t>(size) * size * 3);
    const auto start = Clock::now();
    int64_t images = 0;
    for (int r = 0; r < repeat; ++r) {
      for (size_t i = 0; i < files.size(); ++i) {
        ferry::Rng rng(ferry::MixSeed(r, i));
        if (!ferry::DecodeAndTransform(decoder, files[i].bytes, t, rng, absl::MakeSpan(out)).ok()) {
          std::exit(1);
        }
        ++images;
      }
    }
    const double rate = images / std::chrono::duration<double>(Clock::now() - start).count();
    if (m.full_decode) full_rate = rate;
    std::printf("  RandomResizedCrop(%d) %-13s %8.1f img/s  %5.2fx full_decode\n", size, m.name,
                rate, rate / full_rate);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> dirs;
  int size = 224, repeat = 3, crops = 16;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--size" && i + 1 < argc) {
      size = std::atoi(argv[++i]);
    } else if (a == "--crops" && i + 1 < argc) {
      crops = std::atoi(argv[++i]);
    } else if (a == "--repeat" && i + 1 < argc) {
      repeat = std::atoi(argv[++i]);
    } else {
      dirs.push_back(a);
    }
  }
  if (dirs.empty()) {
    std::fprintf(stderr,
                 "usage: reduced_scale_bench DIR [DIR...] [--size 224] [--crops 16] "
                 "[--repeat 3]\n");
    return 2;
  }
  for (const std::string& dir : dirs) {
    const std::vector<File> files = ReadJpegs(dir);
    int64_t bytes = 0, pixels = 0;
    for (const File& f : files) {
      bytes += static_cast<int64_t>(f.bytes.size());
      pixels += static_cast<int64_t>(f.width) * f.height;
    }
    std::printf("%s: %zu JPEGs, %.0f KiB and %.2f Mpixel mean\n", dir.c_str(), files.size(),
                files.empty() ? 0.0 : bytes / 1024.0 / files.size(),
                files.empty() ? 0.0 : pixels / 1e6 / files.size());
    if (files.empty()) continue;
    Pixels(files, size, crops);
    Pixels(files, size / 4, crops);
    Speed(files, size, repeat);
  }
  return 0;
}
