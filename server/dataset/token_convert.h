// Token-id conversion shared by the token readers (tokens, token_shards): the check of a
// spec's token and output dtypes, and little-endian uint16/uint32 ids from a file mapping
// into the trainer's int64/int32 rows.
//
//   FERRY_ASSIGN_OR_RETURN(TokenDtypes d, CheckTokenDtypes("dataset.tokens", in, out));
//   int64_t bad = ConvertTokens<uint16_t, int64_t>(src, count, row);  // -1: all fit
#ifndef FERRY_SERVER_DATASET_TOKEN_CONVERT_H_
#define FERRY_SERVER_DATASET_TOKEN_CONVERT_H_

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ferry/v1/ferry.pb.h"

namespace ferry {

struct TokenDtypes {
  size_t token_bytes;       // 2 or 4
  ferry::v1::DType output;  // INT64 or INT32
};

// A token dataset's token_dtype (UINT16 or UINT32) and output_dtype (INT64, the default
// when unset, or INT32); INVALID_ARGUMENT naming `<spec>.token_dtype` or
// `<spec>.output_dtype` otherwise.
inline absl::StatusOr<TokenDtypes> CheckTokenDtypes(const std::string& spec,
                                                    ferry::v1::DType token_dtype,
                                                    ferry::v1::DType output_dtype) {
  TokenDtypes d;
  switch (token_dtype) {
    case ferry::v1::UINT16:
      d.token_bytes = 2;
      break;
    case ferry::v1::UINT32:
      d.token_bytes = 4;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(spec,
                                                     ".token_dtype must be UINT16 or UINT32 (got ",
                                                     ferry::v1::DType_Name(token_dtype), ")"));
  }
  d.output = output_dtype == ferry::v1::DTYPE_UNSPECIFIED ? ferry::v1::INT64 : output_dtype;
  if (d.output != ferry::v1::INT64 && d.output != ferry::v1::INT32) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec, ".output_dtype must be INT64 (the default) or INT32 (got ",
                     ferry::v1::DType_Name(d.output), ")"));
  }
  return d;
}

template <typename T>
T LoadLittleEndian(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  if constexpr (std::endian::native == std::endian::big) {
    T swapped = 0;
    for (size_t i = 0; i < sizeof(T); ++i) swapped = (swapped << 8) | ((v >> (8 * i)) & 0xff);
    v = swapped;
  }
  return v;
}

// Converts `count` tokens at `src` into `dst` (either possibly unaligned). Returns the
// position of the first token that does not fit Out, or -1.
template <typename In, typename Out>
int64_t ConvertTokens(const uint8_t* src, int64_t count, uint8_t* dst) {
  int64_t overflow = -1;
  for (int64_t i = 0; i < count; ++i) {
    const In token = LoadLittleEndian<In>(src + i * sizeof(In));
    if (static_cast<uint64_t>(token) > static_cast<uint64_t>(std::numeric_limits<Out>::max()) &&
        overflow < 0) {
      overflow = i;
    }
    const Out value = static_cast<Out>(token);
    std::memcpy(dst + i * sizeof(Out), &value, sizeof(Out));
  }
  return overflow;
}

// ConvertTokens from `In` to the output dtype the reader delivers (INT64, else INT32).
template <typename In>
int64_t ConvertTokensTo(ferry::v1::DType output, const uint8_t* src, int64_t count, uint8_t* dst) {
  return output == ferry::v1::INT64 ? ConvertTokens<In, int64_t>(src, count, dst)
                                    : ConvertTokens<In, int32_t>(src, count, dst);
}

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_TOKEN_CONVERT_H_
