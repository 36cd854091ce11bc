// Values of ferry.proto's enums as the lower-case words that status, ferryctl and the
// metrics show: the value's name without its enum's prefix ("LIMITED_BY_REMOTE_READ" ->
// "remote_read"), so that a value added to the proto needs no table of names anywhere.
#ifndef FERRY_PROTO_FERRY_V1_WORDS_H_
#define FERRY_PROTO_FERRY_V1_WORDS_H_

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "ferry/v1/ferry.pb.h"

namespace ferry::v1 {

// RankStatus.limiting_stage as a word: "trainer", "trainer_cpu", "read", "remote_read",
// "decode", "copy", ...; empty for LIMITING_STAGE_UNSPECIFIED and for a value this build
// does not know (a newer ferryd's).
inline std::string LimitingStageWord(int stage) {
  if (stage == LIMITING_STAGE_UNSPECIFIED || !LimitingStage_IsValid(stage)) return "";
  const std::string name =
      absl::AsciiStrToLower(LimitingStage_Name(static_cast<LimitingStage>(stage)));
  constexpr absl::string_view kPrefix = "limited_by_";
  return absl::StartsWith(name, kPrefix) ? name.substr(kPrefix.size()) : name;
}

}  // namespace ferry::v1

#endif  // FERRY_PROTO_FERRY_V1_WORDS_H_
