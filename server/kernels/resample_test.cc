// GPU tests of resample.h (in kernels_test, CTest label `gpu`): random images of many sizes
// through PlanSourceWindow's windows (RandomResizedCrop with flips, Resize + CenterCrop) to
// several output sizes must equal ResampleWindow, the CPU path, byte for byte. Also a
// timing of a 256-image batch. Each test skips with the reason when the machine has no
// usable GPU.
#include "server/kernels/resample.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "cuda/cuda_resources.h"
#include "cuda/gpu_test_env.h"
#include "gtest/gtest.h"
#include "server/decode/image_transform.h"

namespace ferry {
namespace {

class ResampleTest : public ::testing::Test {
 protected:
  void SetUp() override { FERRY_SKIP_WITHOUT_GPU(); }
};

struct HostImage {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // tightly packed
};

// Noise, or (binary) noise of only 0 and 255, which pushes the sums to the clamps.
HostImage RandomImage(int width, int height, Rng& rng) {
  HostImage im{width, height, std::vector<uint8_t>(static_cast<size_t>(width) * height * 3)};
  const bool binary = rng.Below(3) == 0;
  for (auto& b : im.rgb) {
    const uint8_t v = static_cast<uint8_t>(rng.Next() >> 56);
    b = binary ? (v & 1 ? 255 : 0) : v;
  }
  return im;
}

// The images on the device, each with a pitch of more than width * 3 bytes.
struct DeviceImages {
  DeviceBuffer buffer;
  std::vector<uint64_t> address;
  std::vector<int> pitch;
};

DeviceImages Upload(const std::vector<HostImage>& images, Rng& rng) {
  std::vector<size_t> offset;
  std::vector<int> pitch;
  size_t bytes = 0;
  for (const HostImage& im : images) {
    pitch.push_back(im.width * 3 + 1 + static_cast<int>(rng.Below(64)));
    offset.push_back(bytes);
    bytes += (static_cast<size_t>(pitch.back()) * im.height + 255) / 256 * 256;
  }
  DeviceImages d{ValueOrDie(DeviceBuffer::Create(0, bytes)), {}, pitch};
  // Bytes between rows are never read; make them loud anyway.
  EXPECT_EQ(cudaMemset(d.buffer.data(), 0xEE, bytes), cudaSuccess);
  for (size_t i = 0; i < images.size(); ++i) {
    uint8_t* at = static_cast<uint8_t*>(d.buffer.data()) + offset[i];
    EXPECT_EQ(cudaMemcpy2D(at, pitch[i], images[i].rgb.data(), images[i].width * 3,
                           images[i].width * 3, images[i].height, cudaMemcpyHostToDevice),
              cudaSuccess);
    d.address.push_back(reinterpret_cast<uint64_t>(at));
  }
  return d;
}

ResampleJob MakeJob(const DeviceImages& d, size_t image, const HostImage& im,
                    const SourceWindow& w) {
  ResampleJob job;
  job.src = d.address[image];
  job.width = im.width;
  job.height = im.height;
  job.pitch = d.pitch[image];
  job.x0 = w.x0, job.x1 = w.x1, job.y0 = w.y0, job.y1 = w.y1;
  job.clamp_x0 = w.clamp_x0, job.clamp_x1 = w.clamp_x1;
  job.clamp_y0 = w.clamp_y0, job.clamp_y1 = w.clamp_y1;
  job.mirror = w.mirror ? 1 : 0;
  return job;
}

// One sample of a batch: which image, through which window.
struct Sample {
  size_t image;
  SourceWindow window;
};

std::string Describe(const HostImage& im, const SourceWindow& w) {
  return absl::StrCat(im.width, "x", im.height, " window x [", w.x0, ", ", w.x1, ") y [", w.y0,
                      ", ", w.y1, ") clamp x [", w.clamp_x0, ", ", w.clamp_x1, ") y [", w.clamp_y0,
                      ", ", w.clamp_y1, ")", w.mirror ? " mirrored" : "");
}

// Runs the batch on the GPU and compares every job's output with ResampleWindow's; the
// bytes after the last output must stay untouched. Optionally times `timed_runs` more
// launches and returns the mean milliseconds per batch.
double RunAndCompare(const std::vector<HostImage>& images, const DeviceImages& d,
                     const std::vector<Sample>& samples, int size, int timed_runs = 0) {
  SCOPED_TRACE(absl::StrCat(samples.size(), " windows to ", size, "x", size));
  const size_t out_bytes = static_cast<size_t>(size) * size * 3;
  const size_t guard = 256;
  const size_t total = out_bytes * samples.size() + guard;
  CudaStream stream = ValueOrDie(CudaStream::Create(0));
  DeviceBuffer dst = ValueOrDie(DeviceBuffer::Create(0, total));
  DeviceBuffer job_buffer =
      ValueOrDie(DeviceBuffer::Create(0, samples.size() * sizeof(ResampleJob)));
  EXPECT_EQ(cudaMemset(dst.data(), 0xA5, total), cudaSuccess);
  std::vector<ResampleJob> jobs;
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    jobs.push_back(MakeJob(d, s.image, images[s.image], s.window));
    jobs.back().dst = reinterpret_cast<uint64_t>(static_cast<uint8_t*>(dst.data()) + out_bytes * i);
    EXPECT_TRUE(CheckResampleJob(jobs.back()).ok()) << CheckResampleJob(jobs.back());
  }
  EXPECT_EQ(cudaMemcpy(job_buffer.data(), jobs.data(), jobs.size() * sizeof(ResampleJob),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  const auto* device_jobs = static_cast<const ResampleJob*>(job_buffer.data());
  const int count = static_cast<int>(jobs.size());
  EXPECT_TRUE(LaunchResampleWindows(device_jobs, count, size, stream.get()).ok());
  EXPECT_TRUE(stream.Synchronize().ok());
  std::vector<uint8_t> got(total);
  EXPECT_EQ(cudaMemcpy(got.data(), dst.data(), total, cudaMemcpyDeviceToHost), cudaSuccess);

  std::vector<uint8_t> want(out_bytes);
  size_t differing = 0, differing_jobs = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const HostImage& im = images[samples[i].image];
    ResampleWindow(im.rgb.data(), im.width, im.height, samples[i].window, size, want.data());
    const uint8_t* out = got.data() + out_bytes * i;
    size_t here = 0, first = 0;
    for (size_t b = 0; b < out_bytes; ++b) {
      if (out[b] != want[b] && here++ == 0) first = b;
    }
    if (here == 0) continue;
    differing += here;
    if (differing_jobs++ < 5) {
      const size_t pixel = first / 3;
      ADD_FAILURE() << "job " << i << " (" << Describe(im, samples[i].window) << "): " << here
                    << " of " << out_bytes << " bytes differ; first at row " << pixel / size
                    << " column " << pixel % size << " channel " << first % 3 << ": GPU "
                    << int{out[first]} << ", CPU " << int{want[first]};
    }
  }
  EXPECT_EQ(differing, 0u) << "bytes differing from ResampleWindow, in " << differing_jobs << " of "
                           << samples.size() << " jobs";
  for (size_t b = total - guard; b < total; ++b) {
    if (got[b] != 0xA5) {
      ADD_FAILURE() << "byte " << b - (total - guard) << " after the last output was written";
      break;
    }
  }

  if (timed_runs == 0) return 0;
  CudaEvent start = ValueOrDie(CudaEvent::Create(0, CudaEvent::kTiming));
  CudaEvent stop = ValueOrDie(CudaEvent::Create(0, CudaEvent::kTiming));
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(LaunchResampleWindows(device_jobs, count, size, stream.get()).ok());
  }
  EXPECT_EQ(cudaEventRecord(start.get(), stream.get()), cudaSuccess);
  for (int i = 0; i < timed_runs; ++i) {
    EXPECT_TRUE(LaunchResampleWindows(device_jobs, count, size, stream.get()).ok());
  }
  EXPECT_EQ(cudaEventRecord(stop.get(), stream.get()), cudaSuccess);
  EXPECT_TRUE(stream.Synchronize().ok());
  float ms = 0;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start.get(), stop.get()), cudaSuccess);
  return ms / timed_runs;
}

// Images of the sizes the brief names, the odd and the tiny, and random ones.
std::vector<HostImage> TestImages(Rng& rng) {
  std::vector<std::pair<int, int>> sizes = {{1, 1},    {2, 3},     {3, 2},     {5, 7},
                                            {31, 17},  {500, 375}, {375, 500}, {1300, 900},
                                            {2000, 3}, {4, 1500}};
  for (int i = 0; i < 8; ++i) {
    sizes.emplace_back(1 + static_cast<int>(rng.Below(800)), 1 + static_cast<int>(rng.Below(800)));
  }
  std::vector<HostImage> images;
  for (const auto& [w, h] : sizes) images.push_back(RandomImage(w, h, rng));
  return images;
}

void CheckOutputSize(int size, int seeds_per_image) {
  Rng rng(MixSeed(20, static_cast<uint64_t>(size)));
  const std::vector<HostImage> images = TestImages(rng);
  const DeviceImages d = Upload(images, rng);
  std::vector<Sample> samples;
  const ImageTransform crop = ImageTransform::RandomResizedCrop(size, /*flip=*/true);
  for (size_t i = 0; i < images.size(); ++i) {
    const HostImage& im = images[i];
    for (int seed = 0; seed < seeds_per_image; ++seed) {
      Rng draws(MixSeed(static_cast<uint64_t>(seed), i, static_cast<uint64_t>(size)));
      samples.push_back({i, PlanSourceWindow(im.width, im.height, crop, draws)});
    }
    // Resize + CenterCrop with the resize equal to the size, torchvision's 256 / 224 ratio,
    // and one more, each plain and mirrored.
    for (const int resize : {size, size * 8 / 7, size + 1}) {
      for (const bool flip : {false, true}) {
        ImageTransform center = ImageTransform::ResizeCenterCrop(size, resize);
        center.flip = flip;
        Rng draws(MixSeed(static_cast<uint64_t>(resize), i));
        // With flip, draw until the window is mirrored: both orientations are covered.
        SourceWindow w = PlanSourceWindow(im.width, im.height, center, draws);
        while (flip && !w.mirror) w = PlanSourceWindow(im.width, im.height, center, draws);
        samples.push_back({i, w});
      }
    }
  }
  RunAndCompare(images, d, samples, size);
}

TEST_F(ResampleTest, EqualsResampleWindowAt224) { CheckOutputSize(224, 24); }
TEST_F(ResampleTest, EqualsResampleWindowAtOddSize37) { CheckOutputSize(37, 40); }
// Downscales past the filters' shared table (a 2000-pixel window to 1 pixel, ...).
TEST_F(ResampleTest, EqualsResampleWindowAtSize1) { CheckOutputSize(1, 40); }
// Enlarges every crop of the small images and most crops of the large ones.
TEST_F(ResampleTest, EqualsResampleWindowAt300) { CheckOutputSize(300, 12); }

TEST_F(ResampleTest, EqualsResampleWindowForHandMadeWindows) {
  // Windows no transform makes but the contract allows: partly or wholly outside the clamp
  // range (the filters' nearest-sample fallback), fractional edges, a clamp range inside
  // the image.
  Rng rng(7);
  const std::vector<HostImage> images = {RandomImage(40, 30, rng), RandomImage(9, 13, rng)};
  const DeviceImages d = Upload(images, rng);
  std::vector<Sample> samples;
  for (int i = 0; i < 200; ++i) {
    const size_t image = i % 2;
    const HostImage& im = images[image];
    SourceWindow w;
    w.clamp_x0 = static_cast<int>(rng.Below(im.width));
    w.clamp_x1 = w.clamp_x0 + 1 + static_cast<int>(rng.Below(im.width - w.clamp_x0));
    w.clamp_y0 = static_cast<int>(rng.Below(im.height));
    w.clamp_y1 = w.clamp_y0 + 1 + static_cast<int>(rng.Below(im.height - w.clamp_y0));
    w.x0 = rng.Uniform(-20, im.width + 20);
    w.x1 = w.x0 + rng.Uniform(0.01, 2.0 * im.width);
    w.y0 = rng.Uniform(-20, im.height + 20);
    w.y1 = w.y0 + rng.Uniform(0.01, 2.0 * im.height);
    w.mirror = rng.Below(2) == 1;
    samples.push_back({image, w});
  }
  RunAndCompare(images, d, samples, 23);
}

TEST_F(ResampleTest, MoreJobsThanOneGridHolds) {
  // Over the grid's 65535 images in z: blocks loop over the jobs.
  Rng rng(11);
  const std::vector<HostImage> images = {RandomImage(3, 2, rng), RandomImage(6, 5, rng)};
  const DeviceImages d = Upload(images, rng);
  const ImageTransform crop = ImageTransform::RandomResizedCrop(2, /*flip=*/true);
  std::vector<Sample> samples;
  for (int i = 0; i < 70000; ++i) {
    const size_t image = i % 2;
    samples.push_back(
        {image, PlanSourceWindow(images[image].width, images[image].height, crop, rng)});
  }
  RunAndCompare(images, d, samples, 2);
}

TEST_F(ResampleTest, InvalidJobsWriteZerosAndNullDestinationsNothing) {
  Rng rng(3);
  const std::vector<HostImage> images = {RandomImage(50, 40, rng)};
  const DeviceImages d = Upload(images, rng);
  const int size = 20;
  const size_t out_bytes = size * size * 3;
  DeviceBuffer dst = ValueOrDie(DeviceBuffer::Create(0, out_bytes * 4));
  ASSERT_CUDA(cudaMemset(dst.data(), 0xA5, out_bytes * 4));
  const ImageTransform crop = ImageTransform::RandomResizedCrop(size, /*flip=*/true);
  const SourceWindow w = PlanSourceWindow(50, 40, crop, rng);
  std::vector<ResampleJob> jobs(4, MakeJob(d, 0, images[0], w));
  for (int i = 0; i < 4; ++i) {
    jobs[i].dst = reinterpret_cast<uint64_t>(static_cast<uint8_t*>(dst.data()) + out_bytes * i);
  }
  jobs[1].clamp_x1 = 51;  // past the image
  jobs[2].y1 = std::numeric_limits<double>::quiet_NaN();
  jobs[3].dst = 0;
  EXPECT_EQ(CheckResampleJob(jobs[1]).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckResampleJob(jobs[2]).code(), absl::StatusCode::kInvalidArgument);
  DeviceBuffer job_buffer = ValueOrDie(DeviceBuffer::Create(0, sizeof(ResampleJob) * 4));
  ASSERT_CUDA(
      cudaMemcpy(job_buffer.data(), jobs.data(), sizeof(ResampleJob) * 4, cudaMemcpyHostToDevice));
  CudaStream stream = ValueOrDie(CudaStream::Create(0));
  ASSERT_OK(LaunchResampleWindows(static_cast<const ResampleJob*>(job_buffer.data()), 4, size,
                                  stream.get()));
  ASSERT_OK(stream.Synchronize());
  std::vector<uint8_t> got(out_bytes * 4), want(out_bytes);
  ASSERT_CUDA(cudaMemcpy(got.data(), dst.data(), got.size(), cudaMemcpyDeviceToHost));
  ResampleWindow(images[0].rgb.data(), 50, 40, w, size, want.data());
  EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin()));
  for (size_t b = out_bytes; b < 3 * out_bytes; ++b) ASSERT_EQ(got[b], 0) << b;
  for (size_t b = 3 * out_bytes; b < 4 * out_bytes; ++b) ASSERT_EQ(got[b], 0xA5) << b;
}

TEST_F(ResampleTest, TimesABatchOf256At224) {
  // 256 different 500x375 sources (16 distinct contents), as a batch of ImageNet photos.
  Rng rng(256);
  std::vector<HostImage> contents;
  for (int i = 0; i < 16; ++i) contents.push_back(RandomImage(500, 375, rng));
  std::vector<HostImage> images;
  for (int i = 0; i < 256; ++i) images.push_back(contents[i % 16]);
  const DeviceImages d = Upload(images, rng);
  const ImageTransform crop = ImageTransform::RandomResizedCrop(224, /*flip=*/true);
  const ImageTransform center = ImageTransform::ResizeCenterCrop(224, 256);
  std::vector<Sample> crops, centers;
  for (size_t i = 0; i < images.size(); ++i) {
    crops.push_back({i, PlanSourceWindow(500, 375, crop, rng)});
    centers.push_back({i, PlanSourceWindow(500, 375, center, rng)});
  }
  int device = 0;
  cudaDeviceProp prop;
  ASSERT_CUDA(cudaGetDevice(&device));
  ASSERT_CUDA(cudaGetDeviceProperties(&prop, device));
  const double crop_ms = RunAndCompare(images, d, crops, 224, 50);
  const double center_ms = RunAndCompare(images, d, centers, 224, 50);
  std::printf(
      "resample 256 x 500x375 -> 224x224 on %s: RandomResizedCrop+flip %.3f ms, "
      "Resize(256)+CenterCrop %.3f ms per batch\n",
      prop.name, crop_ms, center_ms);
}

}  // namespace
}  // namespace ferry
