// One page of an S3 ListObjectsV2 answer (the ListBucketResult XML), parsed with expat:
// the objects under the prefix, the "directories" (CommonPrefixes, with a delimiter) and
// the token of the next page.
//
// Contract: any input returns either a page or INVALID_ARGUMENT saying what is wrong (not
// XML, not a ListBucketResult, a size that is no number); it never reads past the input.
// Text is decoded as XML says (entities, character references, CDATA). An object's key is
// the whole key (the prefix included), as S3 sends it without encoding-type=url.
//
//   FERRY_ASSIGN_OR_RETURN(ListPage page, ParseListObjectsV2(body));
//   for (const ListedObject& o : page.objects) ...;
//   if (page.truncated) next request with continuation-token = page.next_token.
#ifndef FERRY_SERVER_REMOTE_S3_LISTING_H_
#define FERRY_SERVER_REMOTE_S3_LISTING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

struct ListedObject {
  std::string key;
  uint64_t size = 0;
  std::string etag;
};

struct ListPage {
  std::vector<ListedObject> objects;
  std::vector<std::string> common_prefixes;
  bool truncated = false;
  std::string next_token;  // NextContinuationToken, when truncated
};

absl::StatusOr<ListPage> ParseListObjectsV2(absl::string_view xml);

}  // namespace ferry

#endif  // FERRY_SERVER_REMOTE_S3_LISTING_H_
