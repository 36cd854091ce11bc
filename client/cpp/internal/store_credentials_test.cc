// The trainer's object-storage credentials, found as the AWS tools find them.
#include "client/cpp/internal/store_credentials.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry::internal {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class StoreCredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = "/tmp/ferry-aws-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    home_ = pattern;
    env_["HOME"] = home_;
  }
  void TearDown() override { std::filesystem::remove_all(home_); }

  void WriteCredentials(const std::string& text) {
    std::filesystem::create_directories(home_ + "/.aws");
    std::ofstream(home_ + "/.aws/credentials") << text;
  }
  absl::StatusOr<std::optional<v1::StoreCredentials>> Find() {
    return TrainerStoreCredentials([this](const char* name) -> const char* {
      auto it = env_.find(name);
      return it == env_.end() ? nullptr : it->second.c_str();
    });
  }

  std::string home_;
  std::map<std::string, std::string> env_;
};

constexpr char kFile[] = R"(# a comment
[default]
aws_access_key_id = AKIDDEFAULT
aws_secret_access_key=default-secret

; another comment
[ training ]
AWS_ACCESS_KEY_ID   =   AKIDTRAINING
aws_secret_access_key = training-secret
aws_session_token = training-token
region = eu-west-1
)";

TEST_F(StoreCredentialsTest, TheEnvironmentComesFirst) {
  WriteCredentials(kFile);
  env_["AWS_ACCESS_KEY_ID"] = "AKIDENV";
  env_["AWS_SECRET_ACCESS_KEY"] = "env-secret";
  env_["AWS_SESSION_TOKEN"] = "env-token";
  env_["AWS_PROFILE"] = "training";
  auto found = Find();
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->access_key_id(), "AKIDENV");
  EXPECT_EQ((*found)->secret_access_key(), "env-secret");
  EXPECT_EQ((*found)->session_token(), "env-token");
}

TEST_F(StoreCredentialsTest, HalfAKeyPairInTheEnvironmentIsNamedAndNoSecretShown) {
  env_["AWS_SECRET_ACCESS_KEY"] = "env-secret";
  auto found = Find();
  ASSERT_EQ(found.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(found.status().message(), HasSubstr("AWS_ACCESS_KEY_ID is not"));
  EXPECT_THAT(found.status().message(), Not(HasSubstr("env-secret")));
}

TEST_F(StoreCredentialsTest, TheDefaultProfileOfTheSharedFile) {
  WriteCredentials(kFile);
  auto found = Find();
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->access_key_id(), "AKIDDEFAULT");
  EXPECT_EQ((*found)->secret_access_key(), "default-secret");
  EXPECT_EQ((*found)->session_token(), "");
}

TEST_F(StoreCredentialsTest, TheProfileAwsProfileNamesWithItsSessionToken) {
  WriteCredentials(kFile);
  env_["AWS_PROFILE"] = "training";
  auto found = Find();
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->access_key_id(), "AKIDTRAINING");
  EXPECT_EQ((*found)->secret_access_key(), "training-secret");
  EXPECT_EQ((*found)->session_token(), "training-token");
}

TEST_F(StoreCredentialsTest, AnotherFileByAwsSharedCredentialsFile) {
  const std::string other = home_ + "/elsewhere";
  std::ofstream(other) << "[default]\naws_access_key_id=AKIDOTHER\naws_secret_access_key=o\n";
  env_["AWS_SHARED_CREDENTIALS_FILE"] = other;
  auto found = Find();
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->access_key_id(), "AKIDOTHER");
  env_["AWS_SHARED_CREDENTIALS_FILE"] = home_ + "/missing";
  found = Find();
  EXPECT_EQ(found.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(found.status().message(), HasSubstr(home_ + "/missing"));
}

TEST_F(StoreCredentialsTest, NothingAnywhereMeansFerrydsOwn) {
  auto found = Find();
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_FALSE(found->has_value());
  WriteCredentials("[other]\naws_access_key_id=A\naws_secret_access_key=B\n");
  found = Find();
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_FALSE(found->has_value()) << "no [default] profile";
}

TEST_F(StoreCredentialsTest, AMissingOrIncompleteProfileIsNamed) {
  WriteCredentials(kFile + std::string("[half]\naws_access_key_id = AKIDHALF\n"));
  env_["AWS_PROFILE"] = "nosuch";
  auto found = Find();
  ASSERT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(found.status().message(), HasSubstr("[nosuch]"));
  env_["AWS_PROFILE"] = "half";
  found = Find();
  ASSERT_EQ(found.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(found.status().message(), HasSubstr("aws_secret_access_key"));
  EXPECT_THAT(found.status().message(), Not(HasSubstr("AKIDHALF")));
}

TEST(SpecReadsS3Test, AnyStringOfTheDatasetAtAnyDepth) {
  v1::JobSpec spec;
  EXPECT_FALSE(SpecReadsS3(spec));
  spec.mutable_dataset()->mutable_token_shards()->add_shards("/data/a.bin");
  EXPECT_FALSE(SpecReadsS3(spec));
  spec.mutable_dataset()->mutable_token_shards()->add_shards("s3://bucket/b.bin");
  EXPECT_TRUE(SpecReadsS3(spec));
  v1::JobSpec http;
  http.mutable_dataset()->mutable_token_shards()->add_shards("https://host/b.bin");
  EXPECT_FALSE(SpecReadsS3(http)) << "HTTP is never signed";
}

}  // namespace
}  // namespace ferry::internal
