#include "server/dataset/sample_source.h"

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "server/dataset/image_folder_source.h"
#include "server/dataset/npy_source.h"
#include "server/dataset/record_source.h"
#include "server/dataset/token_source.h"
#include "server/dataset/webdataset_source.h"

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
                                                               std::shared_ptr<const DatasetFs> fs,
                                                               const DecodeLimits& limits) {
  const ferry::v1::DatasetSpec& dataset = spec.dataset();
  const bool to_gpu = spec.device().rfind("cuda:", 0) == 0;
  const RowStores stores = to_gpu ? RowStores::kStreaming : RowStores::kOrdinary;
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
                                                       limits, std::move(fs)));
      return std::unique_ptr<SampleSource>(std::move(source));
    }
    case ferry::v1::DatasetSpec::kTokens: {
      // A GPU job widens tokens on its device (see TokenSource::Create), except UINT32 ->
      // INT32, whose range check runs here, and where the job asks for them widened here
      // (widen_on_host, for compute-bound trainers: docs/operations.md).
      const bool narrowing = dataset.tokens().token_dtype() == ferry::v1::UINT32 &&
                             dataset.tokens().output_dtype() == ferry::v1::INT32;
      const bool raw = to_gpu && !narrowing && !dataset.tokens().widen_on_host();
      FERRY_ASSIGN_OR_RETURN(auto source, TokenSource::Create(dataset.tokens(), raw, *fs));
      return std::unique_ptr<SampleSource>(std::move(source));
    }
    case ferry::v1::DatasetSpec::kWebdataset: {
      // The transform first: indexing many shards takes a while.
      FERRY_ASSIGN_OR_RETURN(ImageTransform transform, ImageTransformFromSpec(spec.transform()));
      FERRY_ASSIGN_OR_RETURN(auto source,
                             WebDatasetSource::Create(dataset.webdataset(), transform, limits,
                                                      std::move(fs)));
      return std::unique_ptr<SampleSource>(std::move(source));
    }
    case ferry::v1::DatasetSpec::kRecords: {
      FERRY_ASSIGN_OR_RETURN(auto source, RecordSource::Create(dataset.records(), stores, *fs));
      return std::unique_ptr<SampleSource>(std::move(source));
    }
    case ferry::v1::DatasetSpec::kNpy:
      return OpenNpySource(dataset.npy(), stores, *fs);
    case ferry::v1::DatasetSpec::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "dataset must be set: choose dataset.webdataset, dataset.records, dataset.npy, "
      "dataset.image_folder or dataset.tokens");
}

}  // namespace ferry
