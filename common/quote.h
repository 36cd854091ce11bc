// Text a caller sent, quoted for an error message: at most `max_bytes` of it, unprintable
// bytes escaped, and the full length when it was cut. A request may carry a name or path of
// any length; echoing it whole turns a small error into a large one (a 9 KB job id made a
// NOT_FOUND answer exceed the metadata limit).
//
//   absl::NotFoundError(absl::StrCat("no job ", QuoteForMessage(id)));  // no job 'j12'
#ifndef FERRY_COMMON_QUOTE_H_
#define FERRY_COMMON_QUOTE_H_

#include <cstddef>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ferry {

inline std::string QuoteForMessage(absl::string_view text, size_t max_bytes = 256) {
  if (text.size() <= max_bytes) return absl::StrCat("'", absl::CHexEscape(text), "'");
  return absl::StrCat("'", absl::CHexEscape(text.substr(0, max_bytes)), "...' (", text.size(),
                      " bytes)");
}

}  // namespace ferry

#endif  // FERRY_COMMON_QUOTE_H_
