#include "server/remote/sigv4.h"

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

// AWS's worked examples of Signature Version 4 for S3 ("Authenticating Requests: Using the
// Authorization Header", Amazon S3 API Reference): their credentials, requests and the
// signatures AWS computed for them.
const AwsCredentials kExampleCredentials{"AKIAIOSFODNN7EXAMPLE",
                                         "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};

absl::Time ExampleTime() {
  return absl::FromCivil(absl::CivilSecond(2013, 5, 24, 0, 0, 0), absl::UTCTimeZone());
}

std::string HeaderValue(const std::vector<Header>& headers, const std::string& name) {
  for (const Header& h : headers) {
    if (h.first == name) return h.second;
  }
  return "";
}

TEST(SigV4Test, GetObjectWithARangeIsAwssExample) {
  std::vector<Header> headers = {{"Host", "examplebucket.s3.amazonaws.com"},
                                 {"Range", "bytes=0-9"}};
  SignV4({.method = "GET", .path = "/test.txt", .region = "us-east-1"}, kExampleCredentials,
         ExampleTime(), &headers);
  EXPECT_EQ(HeaderValue(headers, "x-amz-date"), "20130524T000000Z");
  EXPECT_EQ(HeaderValue(headers, "x-amz-content-sha256"), kEmptyPayloadSha256);
  EXPECT_EQ(HeaderValue(headers, "authorization"),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
            "aws4_request,SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,Signature="
            "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(SigV4Test, ListObjectsWithAQueryIsAwssExample) {
  std::vector<Header> headers = {{"host", "examplebucket.s3.amazonaws.com"}};
  SignV4({.method = "GET", .path = "/", .query = "max-keys=2&prefix=J", .region = "us-east-1"},
         kExampleCredentials, ExampleTime(), &headers);
  EXPECT_THAT(
      HeaderValue(headers, "authorization"),
      ::testing::EndsWith("SignedHeaders=host;x-amz-content-sha256;x-amz-date,Signature="
                          "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"));
}

TEST(SigV4Test, ASessionTokenIsSentAndSigned) {
  std::vector<Header> headers = {{"host", "examplebucket.s3.amazonaws.com"}};
  AwsCredentials temporary = kExampleCredentials;
  temporary.session_token = "FQoGZXIvYXdzEXAMPLETOKEN";
  SignV4({.path = "/test.txt"}, temporary, ExampleTime(), &headers);
  EXPECT_EQ(HeaderValue(headers, "x-amz-security-token"), "FQoGZXIvYXdzEXAMPLETOKEN");
  EXPECT_THAT(HeaderValue(headers, "authorization"),
              ::testing::HasSubstr("SignedHeaders=host;x-amz-content-sha256;x-amz-date;"
                                   "x-amz-security-token,"));
  // The secret never appears in what is sent.
  for (const Header& h : headers) {
    EXPECT_THAT(h.second, ::testing::Not(::testing::HasSubstr(temporary.secret_access_key)));
  }
}

TEST(SigV4Test, UriEncodingKeepsUnreservedCharactersOnly) {
  EXPECT_EQ(UriEncode("a b/c~d_e.f-g+h=i", true), "a%20b/c~d_e.f-g%2Bh%3Di");
  EXPECT_EQ(UriEncode("a/b", false), "a%2Fb");
  EXPECT_EQ(UriEncode("\xc3\xa9", true), "%C3%A9");
}

}  // namespace
}  // namespace ferry
