// The check of a job's slot layout as ferryd announces it at attach, before the client
// reads a slot. Internal to the client library.
#ifndef FERRY_CLIENT_CPP_INTERNAL_LAYOUT_H_
#define FERRY_CLIENT_CPP_INTERNAL_LAYOUT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "ferry/v1/ferry.pb.h"
#include "google/protobuf/repeated_ptr_field.h"

namespace ferry::internal {

// Checks that `fields` (the job's host layout, or the device layout of a GPU attach) fit
// `num_slots` slots of `slot_bytes` in a slab of `slab_bytes`: every field's rows of
// job.spec().batch_size() samples fit in a slot and row_bytes matches shape and dtype.
// INTERNAL naming the job and the field otherwise.
absl::Status ValidateLayout(const v1::Job& job,
                            const google::protobuf::RepeatedPtrField<v1::Field>& fields,
                            uint64_t num_slots, uint64_t slot_bytes, uint64_t slab_bytes);

}  // namespace ferry::internal

#endif  // FERRY_CLIENT_CPP_INTERNAL_LAYOUT_H_
