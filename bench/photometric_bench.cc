// photometric_bench: the fused photometric stage (server/kernels/photometric.h) next to the
// plain normalize kernel it would replace on the copy stream, for a batch of
// 256 x 224 x 224 x 3 uint8, with per-sample random parameters:
//   - LaunchNormalizeImages (the baseline: one read of the input, one write of the output);
//   - LaunchPhotometric with no op (x / 255), with normalise alone, with a few ops each (what
//     each costs), with ColorJitter's brightness, saturation, hue then normalise and an
//     erase box (pointwise: no extra pass), with [brightness, contrast, saturation, hue, normalise,
//     erase] (one reduction pass), and with a second contrast (two);
// each for bfloat16 and float32 output, beside the device-to-device copy bandwidth. Every
// figure is the median of kReps timed launches (CUDA events around each) after kWarmup
// untimed ones; two input/output sets alternate, so that a launch finds little of its
// batch in the 50 MB L2. GB/s count the input read once and the output written once (the
// floor), in 1e9 bytes per second.
//
//   photometric_bench [device]      (default device 0)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/random.h"
#include "cuda/cuda_resources.h"
#include "server/kernels/normalize.h"
#include "server/kernels/photometric.h"

namespace ferry {
namespace {

constexpr int kWarmup = 3;
constexpr int kReps = 30;

void Check(const absl::Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "photometric_bench: %s: %s\n", what, status.ToString().c_str());
  std::exit(1);
}
template <typename T>
T Take(absl::StatusOr<T> v, const char* what) {
  Check(v.status(), what);
  return std::move(v).value();
}
void CheckCuda(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return;
  std::fprintf(stderr, "photometric_bench: %s: %s\n", what, cudaGetErrorName(error));
  std::exit(1);
}

// Median milliseconds of `launch(rep)` on `stream`, timed by events around each rep.
double MedianMs(const CudaStream& stream, const std::function<void(int)>& launch) {
  cudaEvent_t start, stop;
  CheckCuda(cudaEventCreate(&start), "cudaEventCreate");
  CheckCuda(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> ms;
  for (int rep = 0; rep < kWarmup + kReps; ++rep) {
    CheckCuda(cudaEventRecord(start, static_cast<cudaStream_t>(stream.get())), "record");
    launch(rep);
    CheckCuda(cudaEventRecord(stop, static_cast<cudaStream_t>(stream.get())), "record");
    CheckCuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float elapsed = 0;
    CheckCuda(cudaEventElapsedTime(&elapsed, start, stop), "cudaEventElapsedTime");
    if (rep >= kWarmup) ms.push_back(elapsed);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

// Each sample's program: `kinds` in order, with factors drawn as ColorJitter(0.4, 0.4, 0.4,
// 0.1) would, ImageNet's normalisation, and a RandomErasing-sized box.
std::vector<PhotometricProgram> Programs(int batch, int height, int width,
                                         std::initializer_list<PhotometricKind> kinds) {
  Rng rng(42);
  std::vector<PhotometricProgram> programs(batch);
  for (PhotometricProgram& program : programs) {
    for (PhotometricKind kind : kinds) {
      PhotometricOp& op = program.ops[program.num_ops++];
      op.kind = static_cast<uint32_t>(kind);
      switch (kind) {
        case PhotometricKind::kHue:
          op.a = static_cast<float>(rng.Uniform(-0.1, 0.1));
          break;
        case PhotometricKind::kNormalize:
          for (int c = 0; c < 3; ++c) {
            op.v[c] = kImageNetMean[c];
            op.w[c] = kImageNetStd[c];
          }
          break;
        case PhotometricKind::kErase:
          op.height = height / 3;
          op.width = width / 3;
          op.top = static_cast<int>(rng.Below(height - op.height));
          op.left = static_cast<int>(rng.Below(width - op.width));
          break;
        default:
          op.a = static_cast<float>(rng.Uniform(0.6, 1.4));
          break;
      }
    }
  }
  return programs;
}

int Main(int argc, char** argv) {
  const int device = argc > 1 ? std::atoi(argv[1]) : 0;
  cudaDeviceProp prop;
  CheckCuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  CheckCuda(cudaSetDevice(device), "cudaSetDevice");
  CudaStream stream = Take(CudaStream::Create(device), "stream");

  const int batch = 256, h = 224, w = 224;
  const size_t in_bytes = size_t{batch} * h * w * 3;
  std::vector<DeviceBuffer> inputs, outputs;
  Rng rng(7);
  std::vector<uint8_t> host(in_bytes);
  for (auto& b : host) b = static_cast<uint8_t>(rng.Next() >> 56);
  for (int s = 0; s < 2; ++s) {
    inputs.push_back(Take(DeviceBuffer::Create(device, in_bytes), "input"));
    outputs.push_back(Take(DeviceBuffer::Create(device, in_bytes * 4), "output"));
    CheckCuda(cudaMemcpy(inputs.back().data(), host.data(), in_bytes, cudaMemcpyHostToDevice),
              "fill input");
  }

  const double d2d_ms = MedianMs(stream, [&](int rep) {
    Check(stream.CopyAsync(outputs[rep % 2].data(), outputs[1 - rep % 2].data(), in_bytes * 4),
          "D2D");
  });
  const double d2d_gbps = 2.0 * in_bytes * 4 / (d2d_ms * 1e6);
  std::printf("%s; D2D copy of %.0f MB: %.3f ms = %.0f GB/s read+write\n", prop.name,
              in_bytes * 4 / 1e6, d2d_ms, d2d_gbps);
  std::printf("batch %dx%dx%dx3 uint8 -> CHW; GB/s = (input + output bytes) / time\n\n", batch, h,
              w);
  std::printf("%-56s %-5s %9s %9s %8s\n", "kernel", "dtype", "ms", "GB/s", "vs D2D");

  const auto mean = kImageNetMean;
  const auto std_dev = kImageNetStd;
  auto report = [&](const char* what, OutputDType dtype, double ms) {
    const double bytes = in_bytes + double(in_bytes) * OutputDTypeSize(dtype);
    const double gbps = bytes / (ms * 1e6);
    std::printf("%-56s %-5s %9.3f %9.0f %7.0f%%\n", what,
                dtype == OutputDType::kBFloat16 ? "bf16" : "fp32", ms, gbps, 100 * gbps / d2d_gbps);
  };

  using K = PhotometricKind;
  struct Variant {
    const char* name;
    std::vector<PhotometricProgram> programs;
  };
  std::vector<Variant> variants = {
      {"photometric: no op (x / 255)", Programs(batch, h, w, {})},
      {"photometric: [normalize]", Programs(batch, h, w, {K::kNormalize})},
      {"photometric: [normalize, erase]", Programs(batch, h, w, {K::kNormalize, K::kErase})},
      {"photometric: [bright, sat, normalize]",
       Programs(batch, h, w, {K::kBrightness, K::kSaturation, K::kNormalize})},
      {"photometric: [hue, normalize]", Programs(batch, h, w, {K::kHue, K::kNormalize})},
      {"photometric: [bright, sat, hue, normalize, erase]",
       Programs(batch, h, w, {K::kBrightness, K::kSaturation, K::kHue, K::kNormalize, K::kErase})},
      {"photometric: [bright, contrast, sat, hue, norm, erase]",
       Programs(batch, h, w,
                {K::kBrightness, K::kContrast, K::kSaturation, K::kHue, K::kNormalize, K::kErase})},
      {"photometric: [bright, contrast, sat, hue, contrast, ...]",
       Programs(batch, h, w,
                {K::kBrightness, K::kContrast, K::kSaturation, K::kHue, K::kContrast, K::kNormalize,
                 K::kErase})},
  };
  std::vector<DeviceBuffer> program_buffers;
  for (const Variant& v : variants) {
    const size_t bytes = v.programs.size() * sizeof(PhotometricProgram);
    program_buffers.push_back(Take(DeviceBuffer::Create(device, bytes), "programs"));
    CheckCuda(
        cudaMemcpy(program_buffers.back().data(), v.programs.data(), bytes, cudaMemcpyHostToDevice),
        "programs");
  }

  for (OutputDType dtype : {OutputDType::kBFloat16, OutputDType::kFloat32}) {
    report("LaunchNormalizeImages (baseline)", dtype, MedianMs(stream, [&](int rep) {
             Check(LaunchNormalizeImages(static_cast<const uint8_t*>(inputs[rep % 2].data()),
                                         outputs[rep % 2].data(), dtype, batch, h, w, mean.data(),
                                         std_dev.data(), stream.get()),
                   "normalize");
           }));
    for (size_t i = 0; i < variants.size(); ++i) {
      const auto* programs = static_cast<const PhotometricProgram*>(program_buffers[i].data());
      report(variants[i].name, dtype, MedianMs(stream, [&](int rep) {
               Check(
                   LaunchPhotometric(static_cast<const uint8_t*>(inputs[rep % 2].data()), programs,
                                     outputs[rep % 2].data(), dtype, batch, h, w, stream.get()),
                   "photometric");
             }));
    }
  }
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::Main(argc, argv); }
