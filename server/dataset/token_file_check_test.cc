// CheckLooksLikeTokens: files that are not raw token ids are named for what they are; token
// ids of real vocabularies, in both widths, pass.
#include "server/dataset/token_file_check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

template <typename T>
std::vector<uint8_t> TokenBytes(const std::vector<T>& ids) {
  std::vector<uint8_t> out(ids.size() * sizeof(T));
  std::memcpy(out.data(), ids.data(), out.size());  // little-endian, as token files are
  return out;
}

absl::Status Check(absl::Span<const uint8_t> bytes) {
  return CheckLooksLikeTokens("token file", "/d/t.bin", bytes);
}

TEST(CheckLooksLikeTokensTest, TokenIdsOfRealVocabulariesPass) {
  std::mt19937 rng(7);
  // Zipf-like draws over GPT-2's 50,257 ids and a 128k vocabulary (uint32), and ids that
  // are all large (every byte of the uint16 above 0x20 would be rare but possible for a
  // few; a whole 64 KiB of it is not).
  std::vector<uint16_t> gpt2(40000);
  for (auto& id : gpt2)
    id = static_cast<uint16_t>(std::min<double>(
        50256, std::exp(std::uniform_real_distribution<double>(0, std::log(50257.0))(rng))));
  EXPECT_TRUE(Check(TokenBytes(gpt2)).ok());
  std::vector<uint32_t> llama(40000);
  for (auto& id : llama) id = std::uniform_int_distribution<uint32_t>(0, 128255)(rng);
  EXPECT_TRUE(Check(TokenBytes(llama)).ok());
  // Short files are not judged as text (a few consecutive ids of one range, 20000 to
  // 20100, are all printable bytes); an empty one is left to the size checks.
  EXPECT_TRUE(Check(Bytes("hello")).ok());
  std::vector<uint16_t> narrow;
  for (uint16_t id = 20000; id < 20000 + kMinTextVerdictBytes / 2 - 1; ++id) narrow.push_back(id);
  EXPECT_TRUE(Check(TokenBytes(narrow)).ok());
  EXPECT_TRUE(Check({}).ok());
}

TEST(CheckLooksLikeTokensTest, TextIsRefusedWithWhatToDo) {
  std::string text;
  while (text.size() < 100000) text += "The quick brown fox jumps over the lazy dog.\r\n\tÉtÉ ";
  absl::Status status = Check(Bytes(text));
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("token file '/d/t.bin' does not hold raw token ids"));
  EXPECT_THAT(status.message(), HasSubstr("looks like text"));
  EXPECT_THAT(status.message(), HasSubstr("tokenize it first"));
  EXPECT_THAT(status.message(), Not(HasSubstr("quick brown")));  // never quotes the file
  // One control byte past the bytes checked does not change the verdict.
  text[kTokenCheckBytes + 10] = '\0';
  EXPECT_FALSE(Check(Bytes(text)).ok());
  text[100] = '\0';
  EXPECT_TRUE(Check(Bytes(text)).ok());
}

TEST(CheckLooksLikeTokensTest, OtherFormatsAreNamed) {
  std::string npy("\x93NUMPY\x01\x00v\x00{'descr': '<u2', 'fortran_order': False, 'shape': (8,), }",
                  68);
  EXPECT_THAT(Check(Bytes(npy)).message(), HasSubstr("a NumPy .npy file"));
  EXPECT_THAT(Check(Bytes(npy)).message(), HasSubstr("ferry.Npy"));
  std::string idx("MMIDIDX\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x08", 18);
  EXPECT_THAT(Check(Bytes(idx)).message(), HasSubstr("a Megatron-LM index (.idx)"));
  std::string tar(1024, '\0');
  tar.replace(0, 8, "0001.jpg");
  tar.replace(257, 6, std::string("ustar\0", 6));
  EXPECT_THAT(Check(Bytes(tar)).message(), HasSubstr("a tar archive"));
  EXPECT_THAT(Check(Bytes(std::string("\x28\xb5\x2f\xfd\x00\x00", 6))).message(),
              HasSubstr("zstd-compressed"));
}

}  // namespace
}  // namespace ferry
