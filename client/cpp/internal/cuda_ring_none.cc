// CudaRing for a libferry built without a CUDA toolkit: every GPU entry point fails with
// FAILED_PRECONDITION, so a cuda job is refused at attach with a clear reason.
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/cpp/internal/cuda_ring.h"

namespace ferry {
namespace internal {
namespace {

absl::Status NoCuda(absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat(what,
                   ": this libferry was built without CUDA; rebuild ferry with a CUDA toolkit "
                   "(nvcc; cmake -DFERRY_WITH_CUDA=ON) or use device 'cpu'"));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const CudaRing>> CudaRing::Open(const CudaRingSpec& spec) {
  return NoCuda(absl::StrCat("attaching to ferryd's GPU ", spec.pci_bus_id));
}

absl::StatusOr<std::string> CudaPciBusId(int ordinal) {
  return NoCuda(absl::StrCat("looking up cuda:", ordinal));
}

bool BuiltWithCuda() { return false; }

}  // namespace internal
}  // namespace ferry
