// Sizes and names of ferry.v1.DType, the element types of every field ferryd delivers: the
// one definition ferryd and the client libraries share (installed with the generated
// messages, as <ferry/v1/dtype.h>).
//
//   const size_t row_bytes = ferry::DTypeSize(field.dtype()) * elements;
//   std::printf("%s\n", ferry::DTypeName(field.dtype()).data());  // "bfloat16"
#ifndef FERRY_PROTO_FERRY_V1_DTYPE_H_
#define FERRY_PROTO_FERRY_V1_DTYPE_H_

#include <cstddef>
#include <string_view>

#include "ferry/v1/ferry.pb.h"

namespace ferry {

// Bytes per element; 0 for DTYPE_UNSPECIFIED or a value this build does not know.
inline size_t DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::UINT8:
    case v1::BOOL:
      return 1;
    case v1::UINT16:
    case v1::FLOAT16:
    case v1::BFLOAT16:
      return 2;
    case v1::UINT32:
    case v1::INT32:
    case v1::FLOAT32:
      return 4;
    case v1::INT64:
      return 8;
    default:
      return 0;
  }
}

// "uint8", "int64", "bfloat16", ... (numpy's and torch's spelling); "unspecified" for
// DTYPE_UNSPECIFIED and any value this build does not know. The view is of a string literal,
// so it is NUL-terminated.
inline std::string_view DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::UINT8:
      return "uint8";
    case v1::UINT16:
      return "uint16";
    case v1::UINT32:
      return "uint32";
    case v1::INT32:
      return "int32";
    case v1::INT64:
      return "int64";
    case v1::FLOAT16:
      return "float16";
    case v1::BFLOAT16:
      return "bfloat16";
    case v1::FLOAT32:
      return "float32";
    case v1::BOOL:
      return "bool";
    default:
      return "unspecified";
  }
}

}  // namespace ferry

#endif  // FERRY_PROTO_FERRY_V1_DTYPE_H_
