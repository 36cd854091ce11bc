// The JobSpec side of a composed transform (ferry.v1.Compose): its ops parsed into
// ComposeSteps with torchvision's defaults, and where the job's images go.
#ifndef FERRY_SERVER_DATASET_COMPOSE_SPEC_H_
#define FERRY_SERVER_DATASET_COMPOSE_SPEC_H_

#include <vector>

#include "absl/status/statusor.h"
#include "ferry/v1/ferry.pb.h"
#include "server/dataset/sample_source.h"
#include "server/decode/compose.h"

namespace ferry {

// The ops of `compose` with defaults filled (torchvision's). INVALID_ARGUMENT naming the
// field, e.g. "transform.compose.ops[2].color_jitter.hue takes 1 or 2 values (got 3)", or
// an op with no kind set.
absl::StatusOr<std::vector<ComposeStep>> ComposeStepsFromSpec(const ferry::v1::Compose& compose);

// Where a job's images go: to a GPU that turns them into floats (options.device_images and
// image_output's dtype, FLOAT32 by default once the ops hold a Normalize), with image_output's
// mean and std. INVALID_ARGUMENT when image_output contradicts the ops: dtype UINT8 with a
// Normalize, or a mean / std other than the Normalize's.
absl::StatusOr<ComposedTransform::Target> ComposeTargetFor(const ferry::v1::JobSpec& spec,
                                                           const SourceOptions& options,
                                                           bool exif_orientation);

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_COMPOSE_SPEC_H_
