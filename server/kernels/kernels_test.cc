// GPU tests of ferryd's kernels (CTest label `gpu`): normalize against a float64 CPU
// reference, the photometric stage against its host reference, token widening and the row
// gather, each against what it must write and the bytes around it. Each test skips with
// the reason when the machine has no usable GPU.
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "cuda/cuda_resources.h"
#include "cuda/gpu_test_env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/kernels/normalize.h"
#include "server/kernels/photometric.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

class KernelTest : public ::testing::Test {
 protected:
  void SetUp() override { FERRY_SKIP_WITHOUT_GPU(); }
};

// ------------------------------------------------------------------------- reference math

double HalfToDouble(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double v;
  if (exponent == 0) {
    v = std::ldexp(mantissa, -24);
  } else if (exponent == 31) {
    v = mantissa ? NAN : INFINITY;
  } else {
    v = std::ldexp(mantissa + 1024, exponent - 25);
  }
  return sign ? -v : v;
}

double BFloat16ToDouble(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Spacing of the output type's values around `r`.
double Ulp(OutputDType dtype, double r) {
  const int mantissa_bits = dtype == OutputDType::kFloat32   ? 23
                            : dtype == OutputDType::kFloat16 ? 10
                                                             : 7;
  const int min_exponent = dtype == OutputDType::kFloat16 ? -14 : -126;
  int e = r == 0 ? min_exponent : std::ilogb(r);
  if (e < min_exponent) e = min_exponent;
  return std::ldexp(1.0, e - mantissa_bits);
}

double ReadOutput(const std::vector<uint8_t>& bytes, OutputDType dtype, size_t i) {
  if (dtype == OutputDType::kFloat32) {
    float f;
    std::memcpy(&f, bytes.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, bytes.data() + 2 * i, 2);
  return dtype == OutputDType::kFloat16 ? HalfToDouble(h) : BFloat16ToDouble(h);
}

const char* Name(OutputDType dtype) {
  return dtype == OutputDType::kFloat32 ? "f32" : dtype == OutputDType::kFloat16 ? "f16" : "bf16";
}

// ---------------------------------------------------------------------------- normalize

struct NormalizeCase {
  int batch, height, width;
  size_t src_offset = 0;  // bytes past a 256-aligned allocation: 1 forces the scalar path
  size_t dst_offset = 0;  // elements past it
  bool imagenet = false;
};

void CheckNormalize(const NormalizeCase& tc, OutputDType dtype, uint64_t seed) {
  SCOPED_TRACE(absl::StrCat(Name(dtype), " ", tc.batch, "x", tc.height, "x", tc.width, " src+",
                            tc.src_offset, " dst+", tc.dst_offset,
                            tc.imagenet ? " imagenet" : " random mean/std"));
  Rng rng(seed);
  const size_t pixels = static_cast<size_t>(tc.height) * tc.width;
  const size_t in_bytes = tc.batch * pixels * 3;
  const size_t elem = OutputDTypeSize(dtype);
  const size_t out_elems = tc.batch * pixels * 3;
  const size_t guard = 64;  // elements after the output that must stay untouched
  float mean[3], std[3];
  for (int c = 0; c < 3; ++c) {
    mean[c] = tc.imagenet ? kImageNetMean[c] : static_cast<float>(rng.Uniform());
    std[c] = tc.imagenet ? kImageNetStd[c] : static_cast<float>(0.05 + rng.Uniform());
  }
  std::vector<uint8_t> host_in(in_bytes);
  for (auto& b : host_in) b = static_cast<uint8_t>(rng.Next() >> 56);

  CudaStream stream = ValueOrDie(CudaStream::Create(0));
  DeviceBuffer src = ValueOrDie(DeviceBuffer::Create(0, in_bytes + tc.src_offset));
  const size_t dst_bytes = (tc.dst_offset + out_elems + guard) * elem;
  DeviceBuffer dst = ValueOrDie(DeviceBuffer::Create(0, dst_bytes));
  uint8_t* src_ptr = static_cast<uint8_t*>(src.data()) + tc.src_offset;
  ASSERT_CUDA(cudaMemcpy(src_ptr, host_in.data(), in_bytes, cudaMemcpyHostToDevice));
  // Poison: all-ones bits are NaN in each output type.
  ASSERT_CUDA(cudaMemset(dst.data(), 0xff, dst_bytes));
  // The kernels run on a non-blocking stream, which does not wait for the legacy stream's
  // memset and copy (cudaMemset returns before it is done): finish them first.
  ASSERT_CUDA(cudaDeviceSynchronize());

  ASSERT_OK(LaunchNormalizeImages(src_ptr, static_cast<uint8_t*>(dst.data()) + tc.dst_offset * elem,
                                  dtype, tc.batch, tc.height, tc.width, mean, std, stream.get()));
  ASSERT_OK(stream.Synchronize());
  std::vector<uint8_t> all(dst_bytes);
  ASSERT_CUDA(cudaMemcpy(all.data(), dst.data(), dst_bytes, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < tc.dst_offset * elem; ++i)
    ASSERT_EQ(all[i], 0xff) << "wrote before the output";
  for (size_t i = (tc.dst_offset + out_elems) * elem; i < dst_bytes; ++i) {
    ASSERT_EQ(all[i], 0xff) << "wrote past the output";
  }
  std::vector<uint8_t> out(all.begin() + tc.dst_offset * elem,
                           all.begin() + (tc.dst_offset + out_elems) * elem);

  double err2 = 0, ref2 = 0;
  size_t bad = 0;
  for (int b = 0; b < tc.batch; ++b) {
    for (int c = 0; c < 3; ++c) {
      const double scale = 1.0 / (255.0 * std[c]), bias = -static_cast<double>(mean[c]) / std[c];
      for (size_t i = 0; i < pixels; ++i) {
        const double x = host_in[(b * pixels + i) * 3 + c];
        const double ref = (x / 255.0 - mean[c]) / std[c];
        const size_t o = (static_cast<size_t>(b) * 3 + c) * pixels + i;
        const double got = ReadOutput(out, dtype, o);
        // One unit in the last place of the output type, plus float32 arithmetic (scale
        // and bias rounded to float32, one fused multiply-add) with a safety factor 2.
        const double bound =
            Ulp(dtype, ref) +
            2 * 0x1p-24 * (x * std::fabs(scale) + std::fabs(bias) + std::fabs(ref));
        if (!(std::fabs(got - ref) <= bound)) {  // NaN (never written) fails too
          if (++bad <= 5) {
            ADD_FAILURE() << "image " << b << " channel " << c << " pixel " << i << ": got " << got
                          << ", want " << ref << " (x = " << x << ", bound " << bound << ")";
          }
        }
        err2 += (got - ref) * (got - ref);
        ref2 += ref * ref;
      }
    }
  }
  EXPECT_EQ(bad, 0u);
  const double relative = std::sqrt(err2 / ref2);
  const double limit = dtype == OutputDType::kFloat32   ? 1e-6
                       : dtype == OutputDType::kFloat16 ? 1e-3
                                                        : 8e-3;
  EXPECT_LT(relative, limit) << "||out - ref|| / ||ref||";
}

TEST_F(KernelTest, NormalizeMatchesFloat64Reference) {
  const NormalizeCase cases[] = {
      {1, 3, 5},                  // 15 pixels: scalar path
      {7, 224, 224},              // vector path, ImageNet size
      {7, 224, 224, 0, 0, true},  // with the preset
      {3, 37, 41},                // odd everything
      {2, 4, 4},                  // one 16-pixel group per image
      {5, 16, 24},                // vector path, several groups
      {3, 224, 224, 1, 0},        // unaligned source: scalar path
      {3, 224, 224, 0, 3},        // unaligned destination: scalar path
  };
  uint64_t seed = 0x5eed;
  for (OutputDType dtype : {OutputDType::kFloat32, OutputDType::kFloat16, OutputDType::kBFloat16}) {
    for (const NormalizeCase& tc : cases) CheckNormalize(tc, dtype, ++seed);
  }
}

TEST_F(KernelTest, NormalizeSameResultOnBothPaths) {
  // The vector and scalar kernels must agree bit for bit (same float32 formula).
  const int batch = 4, h = 32, w = 48;
  const size_t n = static_cast<size_t>(batch) * h * w * 3;
  Rng rng(99);
  std::vector<uint8_t> in(n);
  for (auto& b : in) b = static_cast<uint8_t>(rng.Next() >> 56);
  CudaStream stream = ValueOrDie(CudaStream::Create(0));
  DeviceBuffer src = ValueOrDie(DeviceBuffer::Create(0, n));
  DeviceBuffer a = ValueOrDie(DeviceBuffer::Create(0, n * 2));
  DeviceBuffer b = ValueOrDie(DeviceBuffer::Create(0, n * 2 + 16));
  uint8_t* src_aligned = static_cast<uint8_t*>(src.data());
  ASSERT_CUDA(cudaMemcpy(src_aligned, in.data(), n, cudaMemcpyHostToDevice));
  // The kernels run on a non-blocking stream, which does not wait for the legacy stream's
  // memset and copy (cudaMemset returns before it is done): finish them first.
  ASSERT_CUDA(cudaDeviceSynchronize());
  const auto mean = kImageNetMean;
  const auto std = kImageNetStd;
  ASSERT_OK(LaunchNormalizeImages(src_aligned, a.data(), OutputDType::kBFloat16, batch, h, w,
                                  mean.data(), std.data(), stream.get()));
  uint8_t* b_unaligned = static_cast<uint8_t*>(b.data()) + 2;
  ASSERT_OK(LaunchNormalizeImages(src_aligned, b_unaligned, OutputDType::kBFloat16, batch, h, w,
                                  mean.data(), std.data(), stream.get()));
  ASSERT_OK(stream.Synchronize());
  std::vector<uint8_t> ha(n * 2), hb(n * 2);
  ASSERT_CUDA(cudaMemcpy(ha.data(), a.data(), n * 2, cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaMemcpy(hb.data(), b_unaligned, n * 2, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(ha == hb);
}

// -------------------------------------------------------------------------- photometric

// A program as the composed transform's workers draw one: ColorJitter's four adjustments in
// a random order (each present with probability 0.8), sometimes a second contrast, then
// maybe grayscale, normalise, a brightness after normalise (which clamps again), and up to
// two erase boxes that may cross the image's edges. Hue never follows normalise there: on
// values outside [0, 1] torchvision's HSV has poles (s = range / max with max near 0) that
// amplify float32 rounding without bound, which no training pipeline meets.
PhotometricProgram RandomProgram(Rng& rng, int height, int width) {
  PhotometricProgram program;
  auto add = [&](PhotometricKind kind, float a) {
    PhotometricOp& op = program.ops[program.num_ops++];
    op.kind = static_cast<uint32_t>(kind);
    op.a = a;
    return &op;
  };
  if (rng.Uniform() < 0.1) return program;  // no op: x / 255
  PhotometricKind jitter[4] = {PhotometricKind::kBrightness, PhotometricKind::kContrast,
                               PhotometricKind::kSaturation, PhotometricKind::kHue};
  for (int i = 3; i > 0; --i) std::swap(jitter[i], jitter[rng.Below(i + 1)]);
  for (PhotometricKind kind : jitter) {
    if (rng.Uniform() >= 0.8) continue;
    switch (kind) {
      case PhotometricKind::kBrightness:
        add(kind, static_cast<float>(rng.Uniform(0.4, 1.8)));
        break;
      case PhotometricKind::kContrast:
        add(kind, static_cast<float>(rng.Uniform(0.3, 2.0)));
        if (rng.Uniform() < 0.3) add(kind, static_cast<float>(rng.Uniform(0.5, 1.5)));
        break;
      case PhotometricKind::kSaturation:
        add(kind, static_cast<float>(rng.Uniform(0.0, 2.0)));
        break;
      default:
        add(kind, static_cast<float>(rng.Uniform(-0.5, 0.5)));
        break;
    }
  }
  if (rng.Uniform() < 0.2) add(PhotometricKind::kGrayscale, 0);
  if (rng.Uniform() < 0.7) {
    PhotometricOp* op = add(PhotometricKind::kNormalize, 0);
    for (int c = 0; c < 3; ++c) {
      op->v[c] = static_cast<float>(rng.Uniform(0.3, 0.6));
      op->w[c] = static_cast<float>(rng.Uniform(0.15, 0.3));
    }
    if (rng.Uniform() < 0.2) add(PhotometricKind::kBrightness, static_cast<float>(rng.Uniform()));
  }
  const int boxes = static_cast<int>(rng.Below(3));
  for (int i = 0; i < boxes; ++i) {
    PhotometricOp* op = add(PhotometricKind::kErase, 0);
    op->top = static_cast<int>(rng.Below(height + 4)) - 2;  // may start above or below
    op->left = static_cast<int>(rng.Below(width + 4)) - 2;
    op->height = static_cast<int>(rng.Below(height + 1));  // may pass the bottom
    op->width = static_cast<int>(rng.Below(width + 1));
    for (float& v : op->v) v = static_cast<float>(rng.Uniform(-2, 2));
  }
  return program;
}

struct PhotometricCase {
  int batch, height, width;
  size_t dst_offset = 0;  // elements past a 256-aligned allocation: 1 forces the scalar path
};

// Largest |got - ref| over a run, in absolute terms and in units of the bound.
struct PhotometricError {
  double max_abs = 0;
  double max_of_bound = 0;
};

void CheckPhotometric(const PhotometricCase& tc, OutputDType dtype, uint64_t seed,
                      PhotometricError& error) {
  SCOPED_TRACE(absl::StrCat(Name(dtype), " ", tc.batch, "x", tc.height, "x", tc.width, " dst+",
                            tc.dst_offset));
  Rng rng(seed);
  const size_t pixels = static_cast<size_t>(tc.height) * tc.width;
  const size_t in_bytes = tc.batch * pixels * 3;
  const size_t elem = OutputDTypeSize(dtype);
  const size_t out_elems = tc.batch * pixels * 3;
  const size_t guard = 64;
  std::vector<uint8_t> host_in(in_bytes);
  for (auto& b : host_in) b = static_cast<uint8_t>(rng.Next() >> 56);
  // Some flat images, whose pixels are all gray (hue's eqc) and equal (contrast's mean).
  for (int b = 1; b < tc.batch; b += 5) {
    std::memset(host_in.data() + b * pixels * 3, static_cast<int>(rng.Below(256)), pixels * 3);
  }
  std::vector<PhotometricProgram> programs(tc.batch);
  for (auto& p : programs) p = RandomProgram(rng, tc.height, tc.width);
  // A program that declares more ops than it holds, and one that ends at an unknown kind.
  programs[0].num_ops = 1000;
  if (tc.batch > 2) {
    programs[2].ops[programs[2].num_ops].kind = 99;
    programs[2].ops[programs[2].num_ops + 1].kind = 1;  // never reached
    programs[2].ops[programs[2].num_ops + 1].a = 0;
    programs[2].num_ops += 2;
  }

  CudaStream stream = ValueOrDie(CudaStream::Create(0));
  DeviceBuffer src = ValueOrDie(DeviceBuffer::Create(0, in_bytes));
  DeviceBuffer prog = ValueOrDie(DeviceBuffer::Create(0, tc.batch * sizeof(PhotometricProgram)));
  const size_t dst_bytes = (tc.dst_offset + out_elems + guard) * elem;
  DeviceBuffer dst = ValueOrDie(DeviceBuffer::Create(0, dst_bytes));
  ASSERT_CUDA(cudaMemcpy(src.data(), host_in.data(), in_bytes, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(prog.data(), programs.data(), tc.batch * sizeof(PhotometricProgram),
                         cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemset(dst.data(), 0xff, dst_bytes));  // NaN in every output type
  ASSERT_CUDA(cudaDeviceSynchronize());

  ASSERT_OK(LaunchPhotometric(static_cast<const uint8_t*>(src.data()),
                              static_cast<const PhotometricProgram*>(prog.data()),
                              static_cast<uint8_t*>(dst.data()) + tc.dst_offset * elem, dtype,
                              tc.batch, tc.height, tc.width, stream.get()));
  ASSERT_OK(stream.Synchronize());
  std::vector<uint8_t> all(dst_bytes);
  ASSERT_CUDA(cudaMemcpy(all.data(), dst.data(), dst_bytes, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < tc.dst_offset * elem; ++i) {
    ASSERT_EQ(all[i], 0xff) << "wrote before the output";
  }
  for (size_t i = (tc.dst_offset + out_elems) * elem; i < dst_bytes; ++i) {
    ASSERT_EQ(all[i], 0xff) << "wrote past the output";
  }
  std::vector<uint8_t> out(all.begin() + tc.dst_offset * elem,
                           all.begin() + (tc.dst_offset + out_elems) * elem);

  std::vector<float> ref(pixels * 3);
  size_t bad = 0;
  for (int b = 0; b < tc.batch; ++b) {
    ApplyPhotometricReference(host_in.data() + b * pixels * 3, programs[b], tc.height, tc.width,
                              ref.data());
    for (size_t i = 0; i < pixels * 3; ++i) {
      const double want = ref[i];
      const double got = ReadOutput(out, dtype, b * pixels * 3 + i);
      // float32: the two float32 computations differ by their roundings (fused
      // multiply-adds on the device, the contrast means' summation orders), amplified at
      // most by the normalise's 1 / std < 7. 16-bit: one unit in the last place on top, as
      // such a difference can round the other way.
      const double bound =
          (dtype == OutputDType::kFloat32 ? 0 : Ulp(dtype, want)) + 1e-5 * (1 + std::fabs(want));
      const double diff = std::fabs(got - want);
      if (!(diff <= bound)) {  // NaN (never written) fails too
        if (++bad <= 5) {
          ADD_FAILURE() << "image " << b << " channel " << i / pixels << " pixel " << i % pixels
                        << ": got " << got << ", want " << want << " (bound " << bound
                        << "), program of " << programs[b].num_ops << " ops";
        }
        continue;
      }
      error.max_abs = std::max(error.max_abs, diff);
      error.max_of_bound = std::max(error.max_of_bound, diff / bound);
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST_F(KernelTest, PhotometricMatchesHostReference) {
  const PhotometricCase cases[] = {
      {7, 37, 53},       // odd size: the per-pixel path
      {64, 224, 224},    // the vector path, ImageNet size
      {7, 224, 224, 1},  // unaligned destination: the per-pixel path
      {9, 16, 20},       // vector path, a partial last step
      {3, 2, 2},         // one group of 4 pixels per image
      {5, 1, 1},         // one pixel
      {2, 300, 451},     // larger than one step of the block, odd
  };
  uint64_t seed = 0xc0105;
  for (OutputDType dtype : {OutputDType::kFloat32, OutputDType::kFloat16, OutputDType::kBFloat16}) {
    PhotometricError error;
    for (const PhotometricCase& tc : cases) CheckPhotometric(tc, dtype, ++seed, error);
    std::printf("photometric %s: max |device - host reference| = %.3g (%.2f of the bound)\n",
                Name(dtype), error.max_abs, error.max_of_bound);
  }
}

TEST_F(KernelTest, PhotometricEmptyBatchEnqueuesNothing) {
  CudaStream stream = ValueOrDie(CudaStream::Create(0));
  ASSERT_OK(LaunchPhotometric(nullptr, nullptr, nullptr, OutputDType::kFloat32, 0, 224, 224,
                              stream.get()));
  ASSERT_OK(stream.Synchronize());
}

// ------------------------------------------------------------------------------ tokens

template <typename In, typename Out>
void CheckWiden(TokenInput in_type, TokenOutput out_type, int64_t count, size_t src_off,
                size_t dst_off, uint64_t seed) {
  SCOPED_TRACE(absl::StrCat(sizeof(In) * 8, "->", sizeof(Out) * 8, " count ", count, " src+",
                            src_off, " dst+", dst_off));
  Rng rng(seed);
  std::vector<In> host(count);
  for (auto& v : host) v = static_cast<In>(rng.Next());
  if (count > 2) {
    host[0] = std::numeric_limits<In>::max();
    host[1] = 0;
    host[2] = std::numeric_limits<In>::lowest();
  }
  const size_t guard = 8;
  CudaStream stream = ValueOrDie(CudaStream::Create(0));
  DeviceBuffer src = ValueOrDie(DeviceBuffer::Create(0, (count + src_off) * sizeof(In)));
  const size_t dst_bytes = (count + dst_off + guard) * sizeof(Out);
  DeviceBuffer dst = ValueOrDie(DeviceBuffer::Create(0, dst_bytes));
  In* src_ptr = static_cast<In*>(src.data()) + src_off;
  Out* dst_ptr = static_cast<Out*>(dst.data()) + dst_off;
  ASSERT_CUDA(cudaMemcpy(src_ptr, host.data(), count * sizeof(In), cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemset(dst.data(), 0xa5, dst_bytes));
  // The kernels run on a non-blocking stream, which does not wait for the legacy stream's
  // memset and copy (cudaMemset returns before it is done): finish them first.
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_OK(LaunchWidenTokens(src_ptr, in_type, dst_ptr, out_type, count, stream.get()));
  ASSERT_OK(stream.Synchronize());
  std::vector<Out> all(count + dst_off + guard);
  ASSERT_CUDA(cudaMemcpy(all.data(), dst.data(), dst_bytes, cudaMemcpyDeviceToHost));
  Out poison;
  std::memset(&poison, 0xa5, sizeof(poison));
  for (size_t i = 0; i < dst_off; ++i) ASSERT_EQ(all[i], poison);
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(all[dst_off + i], static_cast<Out>(host[i])) << "token " << i;
  }
  for (size_t i = 0; i < guard; ++i) ASSERT_EQ(all[dst_off + count + i], poison);
}

TEST_F(KernelTest, WidenTokens) {
  uint64_t seed = 1;
  for (int64_t count : {1, 7, 1000, 4099, 1 << 20}) {
    for (size_t off : {0, 1}) {
      CheckWiden<uint16_t, int32_t>(TokenInput::kUint16, TokenOutput::kInt32, count, off, 0,
                                    ++seed);
      CheckWiden<uint16_t, int64_t>(TokenInput::kUint16, TokenOutput::kInt64, count, 0, off,
                                    ++seed);
      CheckWiden<uint32_t, int32_t>(TokenInput::kUint32, TokenOutput::kInt32, count, off, off,
                                    ++seed);
      CheckWiden<uint32_t, int64_t>(TokenInput::kUint32, TokenOutput::kInt64, count, off, 0,
                                    ++seed);
      // Sign-extended: the max and min of int32 both survive.
      CheckWiden<int32_t, int64_t>(TokenInput::kInt32, TokenOutput::kInt64, count, off, off,
                                   ++seed);
    }
  }
}

// ------------------------------------------------------------------------------ gather

// Records of a real file's read-only mapping, registered read-only, gathered by the
// kernel: every row matches the file, rows with an index out of range are zeros, and the
// bytes around the batch keep their poison.
// host_indices: LaunchGatherRowsIndexedFromHost, which also writes the indices out.
void CheckGather(size_t row_bytes, size_t header, int64_t count, int blocks, bool host_indices,
                 uint64_t seed) {
  SCOPED_TRACE(absl::StrCat("rows of ", row_bytes, " B after a ", header, " B header, ", count,
                            " rows on ", blocks, " blocks, indices from ",
                            host_indices ? "the host" : "the device"));
  Rng rng(seed);
  const int64_t num_records = 97;
  std::vector<uint8_t> file_bytes(header + num_records * row_bytes);
  for (auto& b : file_bytes) b = static_cast<uint8_t>(rng.Next() >> 56);
  char path[] = "/tmp/ferry-gather-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::unlink(path);
  ASSERT_EQ(::write(fd, file_bytes.data(), file_bytes.size()),
            static_cast<ssize_t>(file_bytes.size()));
  void* map = ::mmap(nullptr, file_bytes.size(), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(map, MAP_FAILED);
  {
    HostRegistration registration = ValueOrDie(
        HostRegistration::Create(0, map, file_bytes.size(), HostRegistration::Access::kReadOnly));
    const auto* records = static_cast<const uint8_t*>(ValueOrDie(registration.DeviceData(0)));
    std::vector<int64_t> indices(count);
    for (auto& i : indices) i = static_cast<int64_t>(rng.Next() % num_records);
    if (count >= 3) {
      indices[1] = -1;           // no sample: zeros
      indices[2] = num_records;  // likewise
    }
    std::vector<int64_t> indices_copy;
    const size_t guard = 64;
    const size_t dst_bytes = guard + count * row_bytes + guard;
    CudaStream stream = ValueOrDie(CudaStream::Create(0));
    DeviceBuffer dst = ValueOrDie(DeviceBuffer::Create(0, dst_bytes));
    DeviceBuffer index_buffer = ValueOrDie(DeviceBuffer::Create(0, count * sizeof(int64_t)));
    ASSERT_CUDA(cudaMemcpy(index_buffer.data(), indices.data(), count * sizeof(int64_t),
                           cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemset(dst.data(), 0xa5, dst_bytes));
    ASSERT_CUDA(cudaDeviceSynchronize());
    const GatherSource source{
        .records = records + header, .num_records = num_records, .row_bytes = row_bytes};
    if (host_indices) {
      ASSERT_CUDA(cudaMemset(index_buffer.data(), 0xa5, count * sizeof(int64_t)));
      ASSERT_CUDA(cudaDeviceSynchronize());
      ASSERT_OK(LaunchGatherRowsIndexedFromHost(
          source, indices, static_cast<uint8_t*>(dst.data()) + guard,
          static_cast<int64_t*>(index_buffer.data()), blocks, stream.get()));
      indices_copy = indices;
      std::fill(indices.begin(), indices.end(), -7);  // the launch took its own copy
    } else {
      ASSERT_OK(LaunchGatherRows(source, static_cast<const int64_t*>(index_buffer.data()), count,
                                 static_cast<uint8_t*>(dst.data()) + guard, blocks, stream.get()));
      indices_copy = indices;
    }
    ASSERT_OK(stream.Synchronize());
    indices = indices_copy;
    std::vector<int64_t> written(count);
    ASSERT_CUDA(cudaMemcpy(written.data(), index_buffer.data(), count * sizeof(int64_t),
                           cudaMemcpyDeviceToHost));
    EXPECT_EQ(written, indices);
    std::vector<uint8_t> out(dst_bytes);
    ASSERT_CUDA(cudaMemcpy(out.data(), dst.data(), dst_bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < guard; ++i) ASSERT_EQ(out[i], 0xa5) << "before the batch, byte " << i;
    for (int64_t r = 0; r < count; ++r) {
      const uint8_t* got = out.data() + guard + r * row_bytes;
      if (indices[r] < 0 || indices[r] >= num_records) {
        for (size_t k = 0; k < row_bytes; ++k) ASSERT_EQ(got[k], 0) << "row " << r;
        continue;
      }
      const uint8_t* want = file_bytes.data() + header + indices[r] * row_bytes;
      ASSERT_EQ(std::memcmp(got, want, row_bytes), 0)
          << "row " << r << " (record " << indices[r] << ")";
    }
    for (size_t i = 0; i < guard; ++i) {
      ASSERT_EQ(out[guard + count * row_bytes + i], 0xa5) << "after the batch, byte " << i;
    }
  }
  ::munmap(map, file_bytes.size());
}

TEST_F(KernelTest, GatherRowsFromARegisteredFileMapping) {
  uint64_t seed = 100;
  // 16-, 8-, 4- and 1-byte units; headers that keep or break the records' alignment.
  for (bool host_indices : {false, true}) {
    for (size_t row_bytes : {16384, 48, 24, 12, 5}) {
      for (size_t header : {0, 8, 3}) {
        for (int blocks : {1, 7}) {
          CheckGather(row_bytes, header, 300, blocks, host_indices, ++seed);
        }
      }
    }
    // One row; each parameter list size at its limit.
    for (int64_t count : {1, 64, 256, 1024, 4000}) {
      CheckGather(24, 0, count, 64, host_indices, ++seed);
    }
  }
}

TEST_F(KernelTest, GatherRowsRejectsBadArguments) {
  CudaStream stream = ValueOrDie(CudaStream::Create(0));
  DeviceBuffer buffer = ValueOrDie(DeviceBuffer::Create(0, 4096));
  const auto* base = static_cast<const uint8_t*>(buffer.data());
  const auto* indices = static_cast<const int64_t*>(buffer.data());
  const GatherSource ok{.records = base, .num_records = 4, .row_bytes = 16};
  EXPECT_TRUE(LaunchGatherRows(ok, indices, 0, buffer.data(), 4, stream.get()).ok());
  EXPECT_EQ(LaunchGatherRows(ok, indices, -1, buffer.data(), 4, stream.get()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LaunchGatherRows(ok, nullptr, 2, buffer.data(), 4, stream.get()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LaunchGatherRows(ok, indices, 2, buffer.data(), 0, stream.get()).code(),
            absl::StatusCode::kInvalidArgument);
  const GatherSource huge{.records = base, .num_records = 4, .row_bytes = size_t{1} << 31};
  EXPECT_THAT(LaunchGatherRows(huge, indices, 2, buffer.data(), 4, stream.get()).message(),
              HasSubstr("4 GiB"));
  const std::vector<int64_t> too_many(kMaxGatherRowsPerLaunch + 1, 0);
  EXPECT_THAT(LaunchGatherRowsIndexedFromHost(ok, too_many, buffer.data(), nullptr, 4, stream.get())
                  .message(),
              HasSubstr("at most 4000"));
}

// A failed call leaves the runtime's last error set until someone clears it: the launchers'
// check must not report an earlier failure (here ferry_cuda's) as the launch's own.
TEST_F(KernelTest, LaunchAfterAFailedAllocationSucceeds) {
  ASSERT_FALSE(DeviceBuffer::Create(0, size_t{1} << 50).ok());
  CudaStream stream = ValueOrDie(CudaStream::Create(0));
  DeviceBuffer buf = ValueOrDie(DeviceBuffer::Create(0, 1024));
  ASSERT_OK(LaunchWidenTokens(buf.data(), TokenInput::kUint16,
                              static_cast<uint8_t*>(buf.data()) + 512, TokenOutput::kInt32, 64,
                              stream.get()));
  ASSERT_OK(stream.Synchronize());
}

}  // namespace
}  // namespace ferry
