#include "server/dataset/sample_source.h"

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "server/dataset/image_folder_source.h"
#include "server/dataset/token_source.h"

namespace ferry {

size_t DTypeSize(ferry::v1::DType dtype) {
  switch (dtype) {
    case ferry::v1::UINT8:
      return 1;
    case ferry::v1::UINT16:
    case ferry::v1::FLOAT16:
    case ferry::v1::BFLOAT16:
      return 2;
    case ferry::v1::UINT32:
    case ferry::v1::INT32:
    case ferry::v1::FLOAT32:
      return 4;
    case ferry::v1::INT64:
      return 8;
    default:
      return 0;
  }
}

absl::StatusOr<std::unique_ptr<SampleSource>> MakeSampleSource(const ferry::v1::JobSpec& spec,
                                                               const DecodeLimits& limits) {
  const ferry::v1::DatasetSpec& dataset = spec.dataset();
  switch (dataset.kind_case()) {
    case ferry::v1::DatasetSpec::kImageFolder: {
      if (dataset.image_folder().root().empty()) {
        return absl::InvalidArgumentError(
            "dataset.image_folder.root must be set to a directory of <class>/<file>.jpg");
      }
      // Validate the transform before touching the filesystem: it is cheaper and the
      // listing of a large dataset takes a while.
      FERRY_ASSIGN_OR_RETURN(ImageTransform transform, ImageTransformFromSpec(spec.transform()));
      FERRY_ASSIGN_OR_RETURN(auto source,
                             ImageFolderSource::Create(dataset.image_folder().root(), transform,
                                                       limits));
      return std::unique_ptr<SampleSource>(std::move(source));
    }
    case ferry::v1::DatasetSpec::kTokens: {
      FERRY_ASSIGN_OR_RETURN(auto source, TokenSource::Create(dataset.tokens()));
      return std::unique_ptr<SampleSource>(std::move(source));
    }
    case ferry::v1::DatasetSpec::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "dataset must be set: choose dataset.image_folder or dataset.tokens");
}

}  // namespace ferry
