// ListObjectsV2 answers as stores send them (AWS, s3rver, MinIO's namespace prefixes),
// and answers that are not listings.
#include "server/remote/s3_listing.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(S3ListingTest, ObjectsPrefixesAndTheNextPage) {
  const std::string xml = R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>bucket</Name><Prefix>train/</Prefix><KeyCount>3</KeyCount><MaxKeys>3</MaxKeys>
  <IsTruncated>true</IsTruncated>
  <NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>
  <Contents>
    <Key>train/a&amp;b.jpg</Key><LastModified>2026-11-29T11:27:47.000Z</LastModified>
    <ETag>&quot;b1946ac92492d2347c6235b4d2611184&quot;</ETag><Size>6</Size>
    <Owner><ID>75aa57f09aa0c8caeab4f8c24e99d10f8e7faeebf76c078efc7c6caea54ba06a</ID></Owner>
    <StorageClass>STANDARD</StorageClass>
  </Contents>
  <Contents><Key><![CDATA[train/c<d>.jpg]]></Key><Size>117000</Size><ETag>"x-2"</ETag></Contents>
  <CommonPrefixes><Prefix>train/n01/</Prefix></CommonPrefixes>
  <CommonPrefixes><Prefix>train/n&#x30;2/</Prefix></CommonPrefixes>
</ListBucketResult>)";
  auto page = ParseListObjectsV2(xml);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[0].key, "train/a&b.jpg");
  EXPECT_EQ(page->objects[0].size, 6u);
  EXPECT_EQ(page->objects[0].etag, "\"b1946ac92492d2347c6235b4d2611184\"");
  EXPECT_EQ(page->objects[1].key, "train/c<d>.jpg");
  EXPECT_EQ(page->objects[1].size, 117000u);
  EXPECT_THAT(page->common_prefixes, ElementsAre("train/n01/", "train/n02/"));
  EXPECT_TRUE(page->truncated);
  EXPECT_EQ(page->next_token, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
}

TEST(S3ListingTest, TheLastPageAndAnEmptyOne) {
  auto page = ParseListObjectsV2(
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>k</Key><Size>0</Size>"
      "</Contents></ListBucketResult>");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_FALSE(page->truncated);
  ASSERT_EQ(page->objects.size(), 1u);
  EXPECT_EQ(page->objects[0].size, 0u);
  auto empty = ParseListObjectsV2("<s3:ListBucketResult xmlns:s3=\"x\"/>");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->objects.empty());
}

TEST(S3ListingTest, WhatIsNotAListingSaysWhy) {
  for (const char* bad : {"", "not xml", "<ListBucketResult><Contents>",
                          "<ListBucketResult></ListBucketResult><extra/>"}) {
    auto page = ParseListObjectsV2(bad);
    EXPECT_EQ(page.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  auto error = ParseListObjectsV2("<Error><Code>AccessDenied</Code></Error>");
  EXPECT_THAT(error.status().message(), HasSubstr("<Error>"));
  auto size = ParseListObjectsV2(
      "<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>");
  EXPECT_THAT(size.status().message(), HasSubstr("'-1', not a number"));
  auto token = ParseListObjectsV2(
      "<ListBucketResult><IsTruncated>true</IsTruncated>"
      "</ListBucketResult>");
  EXPECT_THAT(token.status().message(), HasSubstr("NextContinuationToken"));
}

TEST(S3ListingTest, EntityExpansionIsBounded) {
  // The "billion laughs": expat refuses the amplification instead of expanding it.
  std::string xml = "<?xml version=\"1.0\"?><!DOCTYPE l [<!ENTITY a \"aaaaaaaaaaaaaaaa\">";
  char prev = 'a';
  for (char e = 'b'; e <= 'j'; ++e, ++prev) {
    xml += std::string("<!ENTITY ") + e + " \"";
    for (int i = 0; i < 16; ++i) xml += std::string("&") + prev + ";";
    xml += "\">";
  }
  xml += "]><ListBucketResult><Contents><Key>&j;</Key></Contents></ListBucketResult>";
  auto page = ParseListObjectsV2(xml);
  EXPECT_EQ(page.status().code(), absl::StatusCode::kInvalidArgument) << page.status();
}

}  // namespace
}  // namespace ferry
