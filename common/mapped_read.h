// Reads of a file mapping that survive the file shrinking under them. A MAP_SHARED mapping
// of a file that someone truncates (or rewrites shorter) raises SIGBUS at the first touch
// of a page past the new end, which kills the whole process. GuardMappedRead runs a read
// so that such a fault, inside the mapping it names, ends the read with an error instead;
// any other SIGBUS goes to the handler that was there before (the default: the process
// dies, as it should for a fault ferry did not expect).
//
//   absl::Status s = GuardMappedRead(file->bytes(), [&] { memcpy(dst, src, n); });
//   if (!s.ok()) ...  // DATA_LOSS: the file shrank while mapped
//
// `read` is abandoned where it faults (siglongjmp): it must only read memory and write
// memory its caller owns, hold no lock, allocate nothing and own nothing with a
// destructor. Thread-safe; guards do not nest on one thread.
#ifndef FERRY_COMMON_MAPPED_READ_H_
#define FERRY_COMMON_MAPPED_READ_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"

namespace ferry {

// OK when `read` ran to its end; DATA_LOSS when it faulted on a page of `mapping` that the
// file no longer has.
absl::Status GuardMappedRead(absl::Span<const uint8_t> mapping, absl::FunctionRef<void()> read);

}  // namespace ferry

#endif  // FERRY_COMMON_MAPPED_READ_H_
