#ifndef FERRY_COMMON_STREAMING_COPY_H_
#define FERRY_COMMON_STREAMING_COPY_H_

#include <cstddef>

namespace ferry {

// Copies n bytes from src to dst (not overlapping) with non-temporal stores where the CPU
// has them (x86-64), std::memcpy elsewhere and for copies under kStreamingCopyMinBytes.
//
// Why: ferryd's workers copy sample rows into a pinned slot that the GPU's copy engine
// reads by DMA soon after, and that the CPU never reads again. Rows written with ordinary
// stores are still dirty in the writing cores' caches when the DMA reads them, and each
// such line must be fetched from a core instead of memory: on the H100 box, 1 MiB copies
// from slots being written with memcpy ran at 0.46x of copies from untouched memory, with
// streaming stores at 0.80x (bench/h2d_bench), and ferryd's 1 MiB raw records went from
// 0.62-0.64x to 0.77-0.85x of the pinned peak (docs/benchmarks.md).
//
// Contract: on return the bytes are globally visible, ordered before any later store of
// this thread (the function ends with a store fence), so a release that publishes the
// slot afterwards publishes these bytes too.
void StreamingCopy(void* dst, const void* src, size_t n);

inline constexpr size_t kStreamingCopyMinBytes = 1024;

}  // namespace ferry

#endif  // FERRY_COMMON_STREAMING_COPY_H_
