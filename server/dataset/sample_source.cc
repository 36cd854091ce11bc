#include "server/dataset/sample_source.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/dataset/blend_source.h"
#include "server/dataset/compose_spec.h"
#include "server/dataset/image_folder_source.h"
#include "server/dataset/indexed_source.h"
#include "server/dataset/megatron_gpt_source.h"
#include "server/dataset/npy_source.h"
#include "server/dataset/record_source.h"
#include "server/dataset/shard_pattern.h"
#include "server/dataset/token_shards_source.h"
#include "server/dataset/token_source.h"
#include "server/dataset/webdataset_index.h"
#include "server/dataset/webdataset_source.h"

namespace ferry {

namespace {

using ferry::v1::DatasetSpec;
using Opened = absl::StatusOr<std::unique_ptr<SampleSource>>;

using Paths = absl::StatusOr<std::vector<std::string>>;

// One entry per dataset kind: its name, the paths its spec names, how it opens and what it
// holds. The one place on the server that knows the kinds (every function below reads it).
struct DatasetKind {
  DatasetSpec::KindCase kind;
  const char* name;        // the DatasetSpec field: "image_folder"
  const char* path_field;  // where its path goes: "dataset.image_folder.root"; null: none
  bool images;             // DatasetHasImages
  // SetWidenOnHost; null for kinds that hold no token ids.
  void (*widen_on_host)(DatasetSpec* dataset);
  // ApplyDatasetDefaults; null for kinds whose unset fields need no value written.
  void (*defaults)(DatasetSpec* dataset);
  // Every path the spec names, shard patterns expanded; empty ones included (the caller
  // refuses them).
  absl::StatusOr<std::vector<std::string>> (*paths)(const DatasetSpec& dataset);
  Opened (*open)(const ferry::v1::JobSpec& spec, std::shared_ptr<const DatasetFs> fs,
                 const SourceOptions& options);
  // ResolveDatasetIndexes; null for kinds that name nothing by reference.
  absl::Status (*resolve)(DatasetSpec* dataset, const DatasetPathCheck& check,
                          const DatasetFs& fs) = nullptr;
  // DatasetFilePaths: the files opening the dataset reads; null: every path of `paths`.
  Paths (*opened_files)(const DatasetSpec& dataset) = nullptr;
};

constexpr DatasetKind kDatasetKinds[] = {
    {DatasetSpec::kImageFolder, "image_folder", "dataset.image_folder.root", true, nullptr, nullptr,
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
     },
     nullptr,
     // Its path is a folder: its files are listed, then opened as the epoch reads them.
     [](const DatasetSpec&) -> Paths { return std::vector<std::string>(); }},
    {DatasetSpec::kTokens, "tokens", "dataset.tokens.path", false,
     [](DatasetSpec* d) { d->mutable_tokens()->set_widen_on_host(true); },
     [](DatasetSpec* d) {
       if (d->tokens().token_dtype() == ferry::v1::DTYPE_UNSPECIFIED) {
         d->mutable_tokens()->set_token_dtype(ferry::v1::UINT16);
       }
     },
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
    {DatasetSpec::kTokenShards, "token_shards", "dataset.token_shards.shards", false,
     [](DatasetSpec* d) { d->mutable_token_shards()->set_widen_on_host(true); },
     [](DatasetSpec* d) {
       if (d->token_shards().token_dtype() == ferry::v1::DTYPE_UNSPECIFIED) {
         d->mutable_token_shards()->set_token_dtype(ferry::v1::UINT16);
       }
     },
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
    {DatasetSpec::kIndexed, "indexed", "dataset.indexed.path_prefix", false,
     [](DatasetSpec* d) { d->mutable_indexed()->set_widen_on_host(true); }, nullptr,
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
    {DatasetSpec::kWebdataset, "webdataset", "dataset.webdataset.shards", true, nullptr, nullptr,
     [](const DatasetSpec& d) -> Paths {
       if (d.webdataset().shards().empty()) {
         if (!d.webdataset().shard_index().empty()) {
           return std::vector<std::string>{d.webdataset().shard_index()};  // not read yet
         }
         return absl::InvalidArgumentError(
             "dataset.webdataset.shards must list at least one .tar path or pattern (or give "
             "dataset.webdataset.shard_index)");
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
     },
     [](DatasetSpec* d, const DatasetPathCheck& check, const DatasetFs& fs) -> absl::Status {
       ferry::v1::WebDataset* w = d->mutable_webdataset();
       if (w->shard_index().empty()) return absl::OkStatus();
       if (!w->shards().empty() || !w->shard_samples().empty()) {
         return absl::InvalidArgumentError(
             "dataset.webdataset.shard_index lists the shards and their samples: give it "
             "without dataset.webdataset.shards and shard_samples");
       }
       FERRY_RETURN_IF_ERROR(check(w->shard_index()));
       FERRY_ASSIGN_OR_RETURN(std::vector<ShardIndexEntry> entries,
                              ReadShardIndex(w->shard_index(), fs));
       for (const ShardIndexEntry& entry : entries) {
         if (entry.location.find_first_of("{}") != std::string::npos) {
           return absl::InvalidArgumentError(absl::StrCat(
               "shard index '", w->shard_index(), "' names shard '", entry.location.substr(0, 512),
               "', whose braces ferry would expand as a pattern; rename the shard"));
         }
         w->add_shards(entry.location);
         w->add_shard_samples(entry.samples);
       }
       w->clear_shard_index();
       return absl::OkStatus();
     },
     [](const DatasetSpec& d) -> Paths {
       // With their counts, shards are opened as the epoch reads them, not at creation.
       if (!d.webdataset().shard_samples().empty()) return std::vector<std::string>();
       return DatasetPaths(d);
     }},
    {DatasetSpec::kRecords, "records", "dataset.records.path", false, nullptr, nullptr,
     [](const DatasetSpec& d) -> Paths { return std::vector<std::string>{d.records().path()}; },
     [](const ferry::v1::JobSpec& spec, std::shared_ptr<const DatasetFs> fs,
        const SourceOptions& options) -> Opened {
       FERRY_ASSIGN_OR_RETURN(
           auto source, RecordSource::Create(spec.dataset().records(), options.row_stores, *fs));
       return std::unique_ptr<SampleSource>(std::move(source));
     }},
    {DatasetSpec::kNpy, "npy", "dataset.npy.path", false, nullptr, nullptr,
     [](const DatasetSpec& d) -> Paths { return std::vector<std::string>{d.npy().path()}; },
     [](const ferry::v1::JobSpec& spec, std::shared_ptr<const DatasetFs> fs,
        const SourceOptions& options) -> Opened {
       return OpenNpySource(spec.dataset().npy(), options.row_stores, *fs);
     }},
    {DatasetSpec::kMegatronGpt, "megatron_gpt", "dataset.megatron_gpt.path_prefixes", false,
     nullptr, nullptr,
     [](const DatasetSpec& d) -> Paths {
       std::vector<std::string> paths;
       for (const std::string& prefix : d.megatron_gpt().path_prefixes()) {
         if (prefix.empty()) return std::vector<std::string>{""};
         paths.push_back(prefix + ".bin");
         paths.push_back(prefix + ".idx");
       }
       if (paths.empty()) return std::vector<std::string>{""};
       return paths;
     },
     [](const ferry::v1::JobSpec& spec, std::shared_ptr<const DatasetFs> fs,
        const SourceOptions& options) -> Opened {
       FERRY_ASSIGN_OR_RETURN(
           auto source, MegatronGptSource::Create(spec.dataset().megatron_gpt(), *fs, options));
       return std::unique_ptr<SampleSource>(std::move(source));
     }},
    {DatasetSpec::kBlend, "blend", nullptr, false, nullptr,
     [](DatasetSpec* d) {
       for (ferry::v1::BlendSource& s : *d->mutable_blend()->mutable_sources()) {
         if (!s.dataset().has_blend()) ApplyDatasetDefaults(s.mutable_dataset());
       }
     },
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
     },
     [](DatasetSpec* d, const DatasetPathCheck& check, const DatasetFs& fs) -> absl::Status {
       for (ferry::v1::BlendSource& s : *d->mutable_blend()->mutable_sources()) {
         if (s.dataset().has_blend()) continue;  // refused when opened, naming the source
         FERRY_RETURN_IF_ERROR(ResolveDatasetIndexes(s.mutable_dataset(), check, fs));
       }
       return absl::OkStatus();
     },
     [](const DatasetSpec& d) -> Paths {
       std::vector<std::string> all;
       for (const ferry::v1::BlendSource& s : d.blend().sources()) {
         if (s.dataset().has_blend()) continue;
         FERRY_ASSIGN_OR_RETURN(std::vector<std::string> files, DatasetFilePaths(s.dataset()));
         all.insert(all.end(), files.begin(), files.end());
       }
       return all;
     }},
};

const DatasetKind* FindKind(DatasetSpec::KindCase kind) {
  for (const DatasetKind& k : kDatasetKinds) {
    if (k.kind == kind) return &k;
  }
  return nullptr;
}

// "dataset.image_folder, dataset.tokens, ... or dataset.blend" (`prefix` before each name),
// or the path fields of the kinds that have one, in the table's order.
std::string KindList(const std::string& prefix, bool path_fields) {
  std::vector<std::string> items;
  for (const DatasetKind& k : kDatasetKinds) {
    if (!path_fields) {
      items.push_back(absl::StrCat(prefix, k.name));
    } else if (k.path_field != nullptr) {
      items.push_back(k.path_field);
    }
  }
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "" : (i + 1 == items.size() ? " or " : ", "), items[i]);
  }
  return out;
}

absl::Status NoKindError() {
  return absl::InvalidArgumentError(
      absl::StrCat("dataset must be set: choose ", KindList("dataset.", false)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SampleSource>> MakeSampleSource(const ferry::v1::JobSpec& spec,
                                                               std::shared_ptr<const DatasetFs> fs,
                                                               const SourceOptions& options) {
  const DatasetKind* kind = FindKind(spec.dataset().kind_case());
  if (kind == nullptr) return NoKindError();
  return kind->open(spec, std::move(fs), options);
}

absl::StatusOr<std::vector<std::string>> DatasetPaths(const ferry::v1::DatasetSpec& dataset) {
  const DatasetKind* kind = FindKind(dataset.kind_case());
  if (kind == nullptr) return NoKindError();
  FERRY_ASSIGN_OR_RETURN(std::vector<std::string> paths, kind->paths(dataset));
  for (const std::string& p : paths) {
    if (p.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset path is empty: give ", KindList("", true)));
    }
  }
  return paths;
}

absl::StatusOr<std::vector<std::string>> DatasetFilePaths(const ferry::v1::DatasetSpec& dataset) {
  const DatasetKind* kind = FindKind(dataset.kind_case());
  if (kind != nullptr && kind->opened_files != nullptr) return kind->opened_files(dataset);
  return DatasetPaths(dataset);
}

bool DatasetHasImages(const ferry::v1::DatasetSpec& dataset) {
  const DatasetKind* kind = FindKind(dataset.kind_case());
  return kind != nullptr && kind->images;
}

void SetWidenOnHost(ferry::v1::DatasetSpec* dataset) {
  const DatasetKind* kind = FindKind(dataset->kind_case());
  if (kind != nullptr && kind->widen_on_host != nullptr) kind->widen_on_host(dataset);
}

absl::Status ResolveDatasetIndexes(ferry::v1::DatasetSpec* dataset, const DatasetPathCheck& check,
                                   const DatasetFs& fs) {
  const DatasetKind* kind = FindKind(dataset->kind_case());
  if (kind == nullptr || kind->resolve == nullptr) return absl::OkStatus();
  return kind->resolve(dataset, check, fs);
}

void ApplyDatasetDefaults(ferry::v1::DatasetSpec* dataset) {
  const DatasetKind* kind = FindKind(dataset->kind_case());
  if (kind != nullptr && kind->defaults != nullptr) kind->defaults(dataset);
}

}  // namespace ferry
