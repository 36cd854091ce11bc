// The WebDataset shard index (widsindex's JSON): parsing, resolving shard locations, and
// ResolveDatasetIndexes reading it into a job's spec.
#include "server/dataset/webdataset_index.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/dataset/sample_source.h"

namespace ferry {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ResolveShardLocationTest, FollowsTheIndexDirectoryOrBase) {
  EXPECT_EQ(ResolveShardLocation("/data/wds", "a.tar"), "/data/wds/a.tar");
  EXPECT_EQ(ResolveShardLocation("/data/wds", "./sub/../b.tar"), "/data/wds/b.tar");
  EXPECT_EQ(ResolveShardLocation("/data/wds", "../other/c.tar"), "/data/other/c.tar");
  EXPECT_EQ(ResolveShardLocation("/data/wds", "/abs/d.tar"), "/abs/d.tar");
  EXPECT_EQ(ResolveShardLocation("/", "../../e.tar"), "/e.tar");
  EXPECT_EQ(ResolveShardLocation("", "f.tar"), "f.tar");
  EXPECT_EQ(ResolveShardLocation("rel/dir", "../g.tar"), "rel/g.tar");
  EXPECT_EQ(ResolveShardLocation("s3://bucket/train", "a.tar"), "s3://bucket/train/a.tar");
  EXPECT_EQ(ResolveShardLocation("s3://bucket", "a.tar"), "s3://bucket/a.tar");
  EXPECT_EQ(ResolveShardLocation("s3://bucket/train/x", "/val/a.tar"), "s3://bucket/val/a.tar");
  EXPECT_EQ(ResolveShardLocation("https://host:8080/d/", "../a.tar"), "https://host:8080/a.tar");
  // A location with a scheme is taken as it is.
  EXPECT_EQ(ResolveShardLocation("/data", "s3://other/a.tar"), "s3://other/a.tar");
  EXPECT_EQ(ResolveShardLocation("s3://b/x", "http://h/a.tar"), "http://h/a.tar");
}

TEST(ParseShardIndexTest, ReadsWidsindexOutput) {
  // As `widsindex create` writes it (md5sum and filesize are not used).
  const std::string json = R"({
    "__kind__": "wids-shard-index-v1", "wids_version": 1, "name": "train",
    "shardlist": [
      {"url": "train-000000.tar", "md5sum": "0f", "nsamples": 10000, "filesize": 1073741824},
      {"url": "sub/train-000001.tar", "nsamples": 9998, "filesize": 1},
      {"url": "s3://elsewhere/x.tar", "nsamples": 0}
    ]})";
  absl::StatusOr<std::vector<ShardIndexEntry>> entries =
      ParseShardIndex(json, "s3://bucket/data/index.json");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].location, "s3://bucket/data/train-000000.tar");
  EXPECT_EQ((*entries)[0].samples, 10000u);
  EXPECT_EQ((*entries)[1].location, "s3://bucket/data/sub/train-000001.tar");
  EXPECT_EQ((*entries)[1].samples, 9998u);
  EXPECT_EQ((*entries)[2].location, "s3://elsewhere/x.tar");
  EXPECT_EQ((*entries)[2].samples, 0u);

  // "base" moves the shards, relative to the index too.
  entries = ParseShardIndex(
      R"({"wids_version": 1, "base": "../shards", "shardlist": [{"url": "a.tar", "nsamples": 3}]})",
      "/data/index/train.json");
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_EQ((*entries)[0].location, "/data/shards/a.tar");
  entries = ParseShardIndex(
      R"({"base": "https://cdn/wds", "shardlist": [{"url": "a.tar", "nsamples": 3}]})",
      "/local/index.json");
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_EQ((*entries)[0].location, "https://cdn/wds/a.tar");
}

TEST(ParseShardIndexTest, ErrorsNameTheIndexAndTheEntry) {
  const struct {
    std::string json;
    std::string message;
  } cases[] = {
      {"{not json", "is not JSON"},
      {"[1, 2]", "is not a JSON object"},
      {R"({"wids_version": 2, "shardlist": [{"url": "a", "nsamples": 1}]})",
       "wids_version other than 1"},
      {R"({"wids_version": 1})", "has no \"shardlist\""},
      {R"({"shardlist": []})", "has no \"shardlist\""},
      {R"({"shardlist": [{"nsamples": 1}]})", "shardlist[0] without a \"url\""},
      {R"({"shardlist": [{"url": "a.tar", "nsamples": 1}, {"url": "b.tar"}]})",
       "shardlist[1] ('b.tar') without a whole \"nsamples\""},
      {R"({"shardlist": [{"url": "a.tar", "nsamples": -1}]})", "without a whole \"nsamples\""},
      {R"({"shardlist": [{"url": "a.tar", "nsamples": 2.5}]})", "without a whole \"nsamples\""},
      {R"({"shardlist": [{"url": "a.tar", "nsamples": "7"}]})", "without a whole \"nsamples\""},
      {R"({"shardlist": [{"url": "a.tar", "nsamples": 1}], "datasets": [{"source_url": "x"}]})",
       "sub-datasets"},
      {R"({"base": 3, "shardlist": [{"url": "a.tar", "nsamples": 1}]})", "\"base\""},
  };
  for (const auto& c : cases) {
    absl::StatusOr<std::vector<ShardIndexEntry>> entries = ParseShardIndex(c.json, "/d/i.json");
    ASSERT_FALSE(entries.ok()) << c.json;
    EXPECT_EQ(entries.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(entries.status().message(), HasSubstr("shard index '/d/i.json'")) << c.json;
    EXPECT_THAT(entries.status().message(), HasSubstr(c.message)) << c.json;
    EXPECT_THAT(entries.status().message(), HasSubstr("widsindex create"));
  }
}

class ResolveDatasetIndexesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ferry_widx_XXXXXX").string();
    dir_ = ::mkdtemp(tmpl.data());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  absl::Status Resolve(ferry::v1::DatasetSpec* dataset) {
    return ResolveDatasetIndexes(
        dataset,
        [this](const std::string& path) {
          checked_.push_back(path);
          return path.find("forbidden") == std::string::npos
                     ? absl::OkStatus()
                     : absl::PermissionDeniedError("not under dataset_roots");
        },
        *UnconfinedDatasetFs());
  }

  std::string dir_;
  std::vector<std::string> checked_;
};

TEST_F(ResolveDatasetIndexesTest, TheIndexBecomesShardsAndCountsInBlendsToo) {
  const std::string index =
      Write("i.json",
            R"({"shardlist": [{"url": "a.tar", "nsamples": 5}, {"url": "b.tar", "nsamples": 6}]})");
  ferry::v1::DatasetSpec dataset;
  dataset.mutable_webdataset()->set_shard_index(index);
  ASSERT_TRUE(Resolve(&dataset).ok());
  EXPECT_THAT(checked_, ElementsAre(index));
  EXPECT_THAT(dataset.webdataset().shards(), ElementsAre(dir_ + "/a.tar", dir_ + "/b.tar"));
  EXPECT_THAT(dataset.webdataset().shard_samples(), ElementsAre(5, 6));
  EXPECT_EQ(dataset.webdataset().shard_index(), "");
  // Creation opens none of the shards: nothing to fetch before it.
  EXPECT_THAT(*DatasetPaths(dataset), ElementsAre(dir_ + "/a.tar", dir_ + "/b.tar"));
  EXPECT_TRUE(DatasetFilePaths(dataset)->empty());
  ferry::v1::DatasetSpec again = dataset;
  ASSERT_TRUE(Resolve(&again).ok());  // nothing left to read
  EXPECT_EQ(again.SerializeAsString(), dataset.SerializeAsString());

  ferry::v1::DatasetSpec blend;
  blend.mutable_blend()->add_sources()->mutable_dataset()->mutable_tokens()->set_path("/t.bin");
  blend.mutable_blend()->add_sources()->mutable_dataset()->mutable_webdataset()->set_shard_index(
      index);
  ASSERT_TRUE(Resolve(&blend).ok());
  EXPECT_THAT(blend.blend().sources(1).dataset().webdataset().shard_samples(), ElementsAre(5, 6));
  EXPECT_THAT(*DatasetFilePaths(blend), ElementsAre("/t.bin"));
}

TEST_F(ResolveDatasetIndexesTest, ErrorsSayWhatToDo) {
  ferry::v1::DatasetSpec both;
  both.mutable_webdataset()->set_shard_index(Write("i.json", "{}"));
  both.mutable_webdataset()->add_shards("/x.tar");
  absl::Status s = Resolve(&both);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("without dataset.webdataset.shards"));

  ferry::v1::DatasetSpec forbidden;
  forbidden.mutable_webdataset()->set_shard_index(Write("forbidden.json", "{}"));
  EXPECT_EQ(Resolve(&forbidden).code(), absl::StatusCode::kPermissionDenied);

  ferry::v1::DatasetSpec missing;
  missing.mutable_webdataset()->set_shard_index(dir_ + "/none.json");
  s = Resolve(&missing);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("cannot read shard index '" + dir_ + "/none.json'"));

  ferry::v1::DatasetSpec braces;
  braces.mutable_webdataset()->set_shard_index(
      Write("b.json", R"({"shardlist": [{"url": "a{1}.tar", "nsamples": 1}]})"));
  s = Resolve(&braces);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("rename the shard"));
}

}  // namespace
}  // namespace ferry
