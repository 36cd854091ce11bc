#include "client/cpp/internal/layout.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "ferry/v1/dtype.h"

namespace ferry::internal {

absl::Status ValidateLayout(const v1::Job& job,
                            const google::protobuf::RepeatedPtrField<v1::Field>& fields,
                            uint64_t num_slots, uint64_t slot_bytes, uint64_t slab_bytes) {
  auto bad = [&](const std::string& what) {
    return absl::InternalError(absl::StrCat("ferryd sent an inconsistent slot layout for job '",
                                            job.id(), "': ", what,
                                            "; client and daemon versions may differ"));
  };
  if (num_slots == 0 || slot_bytes == 0) return bad("no slots");
  if (slot_bytes > slab_bytes / num_slots) {
    return bad(absl::StrCat(num_slots, " slots of ", slot_bytes, " bytes exceed the slab of ",
                            slab_bytes, " bytes"));
  }
  const uint64_t batch_size = job.spec().batch_size();
  for (const v1::Field& f : fields) {
    const uint64_t elem = DTypeSize(f.dtype());
    if (elem == 0) return bad(absl::StrCat("field '", f.name(), "' has an unknown dtype"));
    uint64_t count = 1;
    for (int64_t d : f.shape()) {
      if (d < 0) return bad(absl::StrCat("field '", f.name(), "' has a negative dimension"));
      count *= static_cast<uint64_t>(d);
    }
    if (count * elem != f.row_bytes()) {
      return bad(absl::StrCat("field '", f.name(), "' has row_bytes ", f.row_bytes(),
                              ", shape and ", std::string(DTypeName(f.dtype())), " imply ",
                              count * elem));
    }
    if (f.offset() > slot_bytes || batch_size * f.row_bytes() > slot_bytes - f.offset()) {
      return bad(absl::StrCat("field '", f.name(), "' (offset ", f.offset(), ", ", batch_size,
                              " rows of ", f.row_bytes(), " bytes) overruns the slot of ",
                              slot_bytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ferry::internal
