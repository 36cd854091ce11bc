// Recognises files given as raw token ids that hold something else, before a job serves
// them as tokens: a NumPy .npy, a Megatron-LM .idx or .bin pair's index, a tar archive, a
// compressed stream, or text. Raw little-endian uint16/uint32 ids of any real vocabulary
// hold bytes below 0x20 (the high byte of every id under 8,192; NUL for every id under 256
// and in every uint32 id under 2^24), which text never holds beyond tab and line ends.
//
//   FERRY_RETURN_IF_ERROR(CheckLooksLikeTokens("token file", path, file->bytes()));
#ifndef FERRY_SERVER_DATASET_TOKEN_FILE_CHECK_H_
#define FERRY_SERVER_DATASET_TOKEN_FILE_CHECK_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ferry {

// Bytes from the start of a file that CheckLooksLikeTokens reads.
inline constexpr size_t kTokenCheckBytes = 64 * 1024;
// Fewest bytes a file must have to be judged text.
inline constexpr size_t kMinTextVerdictBytes = 512;

// OK when the first kTokenCheckBytes of `bytes` may be raw token ids. INVALID_ARGUMENT
// otherwise, naming `what` and `path`, what the file looks like and which dataset kind
// reads it. Files shorter than kMinTextVerdictBytes are not judged as text: a few hundred
// tokens of one narrow id range can look like text; 256 tokens of real data do not.
absl::Status CheckLooksLikeTokens(absl::string_view what, absl::string_view path,
                                  absl::Span<const uint8_t> bytes);

// CheckLooksLikeTokens on the head of a mapped file, copied out under MappedFile::Read (a
// file that shrinks meanwhile is DatasetChangedError, not a fault).
class MappedFile;
absl::Status CheckMappedLooksLikeTokens(absl::string_view what, const MappedFile& file);

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_TOKEN_FILE_CHECK_H_
