// Token-id conversion shared by the token readers (tokens, token_shards): little-endian
// uint16/uint32 ids from a file mapping into the trainer's int64/int32 rows.
//
//   int64_t bad = ConvertTokens<uint16_t, int64_t>(src, count, row);  // -1: all fit
#ifndef FERRY_SERVER_DATASET_TOKEN_CONVERT_H_
#define FERRY_SERVER_DATASET_TOKEN_CONVERT_H_

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>

namespace ferry {

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

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_TOKEN_CONVERT_H_
