// StreamingCopy: memcpy with non-temporal (streaming) stores, for buffers that the GPU's
// copy engine reads next and this CPU does not.
//
//   StreamingCopy(slot_row, mapped_file + offset, row_bytes);  // then publish the slot
//
// Why: ferryd's workers copy sample rows into a pinned slot that the copy engine reads by
// DMA soon after. Rows written with ordinary stores are still dirty in the writing cores'
// caches when the DMA reads them, and each such line must be fetched from a core instead
// of memory; streaming stores leave them in memory. bench/h2d_bench measures both, and
// docs/benchmarks.md has the figures.
//
// Contract: on return the bytes are ordered like ordinary stores of this thread, so a
// release that publishes the buffer afterwards (a mutex, an atomic with release order)
// publishes them too: the streaming path ends with a store fence.
#ifndef FERRY_COMMON_STREAMING_COPY_H_
#define FERRY_COMMON_STREAMING_COPY_H_

#include <cstddef>

namespace ferry {

// Copies n bytes from src to dst (not overlapping) with streaming stores where the CPU has
// them (x86-64); std::memcpy elsewhere and below kStreamingCopyMinBytes.
void StreamingCopy(void* dst, const void* src, size_t n);

// Below this, a copy touches a few lines only: write-combining buffers that are flushed
// part-full and the store fence would cost more than the dirty lines they avoid.
inline constexpr size_t kStreamingCopyMinBytes = 1024;

}  // namespace ferry

#endif  // FERRY_COMMON_STREAMING_COPY_H_
