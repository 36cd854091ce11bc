#include "server/dataset/sample_source.h"

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "server/dataset/blend_source.h"
#include "server/dataset/compose_spec.h"
#include "server/dataset/image_folder_source.h"
#include "server/dataset/indexed_source.h"
#include "server/dataset/npy_source.h"
#include "server/dataset/record_source.h"
#include "server/dataset/shard_pattern.h"
#include "server/dataset/token_shards_source.h"
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

namespace {

using ferry::v1::DatasetSpec;
using Opened = absl::StatusOr<std::unique_ptr<SampleSource>>;

// One entry per dataset kind: the paths its spec names and how it opens. The one place that
// knows the kinds (MakeSampleSource and DatasetPaths both read it).
struct DatasetKind {
  DatasetSpec::KindCase kind;
  // Every path the spec names, shard patterns expanded; empty ones included (the caller
  // refuses them).
  absl::StatusOr<std::vector<std::string>> (*paths)(const DatasetSpec& dataset);
  Opened (*open)(const ferry::v1::JobSpec& spec, std::shared_ptr<const DatasetFs> fs,
                 const SourceOptions& options);
};

using Paths = absl::StatusOr<std::vector<std::string>>;

constexpr DatasetKind kDatasetKinds[] = {
    {DatasetSpec::kImageFolder,
     [](const DatasetSpec& d) -> Paths {
       return std::vector<std::string>{d.image_folder().root()};
     },
     [](const ferry::v1::JobSpec& spec, std::shared_ptr<const DatasetFs> fs,
        const SourceOptions& options) -> Opened {
       const ferry::v1::DatasetSpec& dataset = spec.dataset();
       if (dataset.image_folder().root().empty()) {
         return absl::InvalidArgumentError(
             "dataset.image_folder.root must be set to a directory of <class>/<file>.jpg");
       }
       // Validate the transform before touching the filesystem: it is cheaper and the
       // listing of a large dataset takes a while.
       FERRY_ASSIGN_OR_RETURN(
           const ComposedTransform::Target target,
           ComposeTargetFor(spec, options, dataset.image_folder().exif_orientation()));
       FERRY_ASSIGN_OR_RETURN(ImageTransform transform,
                              ImageTransformFromSpec(spec.transform(), target));
       transform.exif_orientation = dataset.image_folder().exif_orientation();
       if (GpuDecodable(transform)) transform.gpu_decode = options.gpu_decode;
       FERRY_ASSIGN_OR_RETURN(auto source,
                              ImageFolderSource::Create(dataset.image_folder().root(), transform,
                                                        options.limits, std::move(fs)));
       return std::unique_ptr<SampleSource>(std::move(source));
     }},
    {DatasetSpec::kTokens,
     [](const DatasetSpec& d) -> Paths { return std::vector<std::string>{d.tokens().path()}; },
     [](const ferry::v1::JobSpec& spec, std::shared_ptr<const DatasetFs> fs,
        const SourceOptions& options) -> Opened {
       const ferry::v1::TokensDataset& tokens = spec.dataset().tokens();
       // Raw tokens where the device widens them (SourceOptions::device_widens_tokens says
       // when not).
       const bool narrowing =
           tokens.token_dtype() == ferry::v1::UINT32 && tokens.output_dtype() == ferry::v1::INT32;
       const bool raw = options.device_widens_tokens && !narrowing && !tokens.widen_on_host();
       FERRY_ASSIGN_OR_RETURN(auto source, TokenSource::Create(tokens, raw, *fs));
       return std::unique_ptr<SampleSource>(std::move(source));
     }},
    {DatasetSpec::kTokenShards,
     [](const DatasetSpec& d) -> Paths {
       if (d.token_shards().shards().empty()) {
         return absl::InvalidArgumentError(
             "dataset.token_shards.shards must list at least one token file or pattern");
       }
       return ExpandShardPatterns(
           {d.token_shards().shards().begin(), d.token_shards().shards().end()},
           TokenShardsSource::kMaxShards);
     },
     [](const ferry::v1::JobSpec& spec, std::shared_ptr<const DatasetFs> fs,
        const SourceOptions& options) -> Opened {
       const ferry::v1::TokenShardsDataset& shards = spec.dataset().token_shards();
       // Raw tokens where the device widens them, as for `tokens`.
       const bool narrowing =
           shards.token_dtype() == ferry::v1::UINT32 && shards.output_dtype() == ferry::v1::INT32;
       const bool raw = options.device_widens_tokens && !narrowing && !shards.widen_on_host();
       FERRY_ASSIGN_OR_RETURN(auto source, TokenShardsSource::Create(shards, raw, *fs));
       return std::unique_ptr<SampleSource>(std::move(source));
     }},
    {DatasetSpec::kIndexed,
     [](const DatasetSpec& d) -> Paths {
       if (d.indexed().path_prefix().empty()) return std::vector<std::string>{""};
       return std::vector<std::string>{d.indexed().path_prefix() + ".bin",
                                       d.indexed().path_prefix() + ".idx"};
     },
     [](const ferry::v1::JobSpec& spec, std::shared_ptr<const DatasetFs> fs,
        const SourceOptions& options) -> Opened {
       // Raw tokens where the device widens them (the token dtype is in the .idx: Create
       // decides).
       FERRY_ASSIGN_OR_RETURN(auto source,
                              IndexedSource::Create(spec.dataset().indexed(), *fs, options));
       return std::unique_ptr<SampleSource>(std::move(source));
     }},
    {DatasetSpec::kWebdataset,
     [](const DatasetSpec& d) -> Paths {
       if (d.webdataset().shards().empty()) {
         return absl::InvalidArgumentError(
             "dataset.webdataset.shards must list at least one .tar path or pattern");
       }
       return ExpandShardPatterns({d.webdataset().shards().begin(), d.webdataset().shards().end()});
     },
     [](const ferry::v1::JobSpec& spec, std::shared_ptr<const DatasetFs> fs,
        const SourceOptions& options) -> Opened {
       // The transform first: indexing many shards takes a while.
       FERRY_ASSIGN_OR_RETURN(
           const ComposedTransform::Target target,
           ComposeTargetFor(spec, options, spec.dataset().webdataset().exif_orientation()));
       FERRY_ASSIGN_OR_RETURN(ImageTransform transform,
                              ImageTransformFromSpec(spec.transform(), target));
       transform.exif_orientation = spec.dataset().webdataset().exif_orientation();
       if (GpuDecodable(transform)) transform.gpu_decode = options.gpu_decode;
       FERRY_ASSIGN_OR_RETURN(auto source,
                              WebDatasetSource::Create(spec.dataset().webdataset(), transform,
                                                       options.limits, std::move(fs)));
       return std::unique_ptr<SampleSource>(std::move(source));
     }},
    {DatasetSpec::kRecords,
     [](const DatasetSpec& d) -> Paths { return std::vector<std::string>{d.records().path()}; },
     [](const ferry::v1::JobSpec& spec, std::shared_ptr<const DatasetFs> fs,
        const SourceOptions& options) -> Opened {
       FERRY_ASSIGN_OR_RETURN(
           auto source, RecordSource::Create(spec.dataset().records(), options.row_stores, *fs));
       return std::unique_ptr<SampleSource>(std::move(source));
     }},
    {DatasetSpec::kNpy,
     [](const DatasetSpec& d) -> Paths { return std::vector<std::string>{d.npy().path()}; },
     [](const ferry::v1::JobSpec& spec, std::shared_ptr<const DatasetFs> fs,
        const SourceOptions& options) -> Opened {
       return OpenNpySource(spec.dataset().npy(), options.row_stores, *fs);
     }},
    {DatasetSpec::kBlend,
     [](const DatasetSpec& d) -> Paths {
       std::vector<std::string> all;
       for (const ferry::v1::BlendSource& s : d.blend().sources()) {
         if (s.dataset().has_blend()) continue;  // refused when opened, naming the source
         FERRY_ASSIGN_OR_RETURN(std::vector<std::string> paths, DatasetPaths(s.dataset()));
         all.insert(all.end(), paths.begin(), paths.end());
       }
       if (all.empty()) {
         return absl::InvalidArgumentError(
             "dataset.blend.sources must list at least one dataset (with its weight)");
       }
       return all;
     },
     [](const ferry::v1::JobSpec& spec, std::shared_ptr<const DatasetFs> fs,
        const SourceOptions& options) -> Opened {
       FERRY_ASSIGN_OR_RETURN(auto source, BlendSource::Create(spec, std::move(fs), options));
       return std::unique_ptr<SampleSource>(std::move(source));
     }},
};

const DatasetKind* FindKind(DatasetSpec::KindCase kind) {
  for (const DatasetKind& k : kDatasetKinds) {
    if (k.kind == kind) return &k;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SampleSource>> MakeSampleSource(const ferry::v1::JobSpec& spec,
                                                               std::shared_ptr<const DatasetFs> fs,
                                                               const SourceOptions& options) {
  const DatasetKind* kind = FindKind(spec.dataset().kind_case());
  if (kind == nullptr) {
    return absl::InvalidArgumentError(
        "dataset must be set: choose dataset.webdataset, dataset.records, dataset.npy, "
        "dataset.image_folder, dataset.tokens, dataset.token_shards, dataset.indexed or "
        "dataset.blend");
  }
  return kind->open(spec, std::move(fs), options);
}

absl::StatusOr<std::vector<std::string>> DatasetPaths(const ferry::v1::DatasetSpec& dataset) {
  const DatasetKind* kind = FindKind(dataset.kind_case());
  if (kind == nullptr) {
    return absl::InvalidArgumentError(
        "dataset is not set: choose image_folder, tokens, token_shards, indexed, webdataset, "
        "records, npy or blend");
  }
  FERRY_ASSIGN_OR_RETURN(std::vector<std::string> paths, kind->paths(dataset));
  for (const std::string& p : paths) {
    if (p.empty()) {
      return absl::InvalidArgumentError(
          "dataset path is empty: give dataset.image_folder.root, dataset.tokens.path, "
          "dataset.records.path, dataset.npy.path, dataset.webdataset.shards, "
          "dataset.token_shards.shards or dataset.indexed.path_prefix");
    }
  }
  return paths;
}

}  // namespace ferry
