#include "server/remote/s3_listing.h"

#include <expat.h>

#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

// The element path the parser is in, as far as ListBucketResult's shape goes: the root,
// then Contents or CommonPrefixes, then a field of either. Deeper elements (Owner's) are
// skipped.
struct Parser {
  ListPage page;
  int depth = 0;
  bool root_seen = false;
  std::string section;  // "Contents", "CommonPrefixes" or "" at depth 1
  std::string field;    // the element whose text is being read
  std::string text;
  ListedObject object;
  std::string error;
};

// Element names without a namespace prefix ("s3:Key" -> "Key").
std::string LocalName(const XML_Char* name) {
  std::string n(name);
  const size_t colon = n.rfind(':');
  return colon == std::string::npos ? n : n.substr(colon + 1);
}

void XMLCALL OnStart(void* user, const XML_Char* name, const XML_Char** /*attributes*/) {
  auto* p = static_cast<Parser*>(user);
  const std::string local = LocalName(name);
  ++p->depth;
  if (p->depth == 1) {
    p->root_seen = true;
    if (local != "ListBucketResult") {
      p->error = absl::StrCat("the answer is a <", local.substr(0, 64),
                              "> where a <ListBucketResult> was expected");
    }
  } else if (p->depth == 2) {
    p->section = local;
    p->field = local;
    p->object = ListedObject();
  } else if (p->depth == 3) {
    p->field = local;
  }
  p->text.clear();
}

void XMLCALL OnText(void* user, const XML_Char* text, int length) {
  auto* p = static_cast<Parser*>(user);
  if (p->depth == 2 || p->depth == 3) p->text.append(text, static_cast<size_t>(length));
}

void XMLCALL OnEnd(void* user, const XML_Char* /*name*/) {
  auto* p = static_cast<Parser*>(user);
  if (p->depth == 2) {
    if (p->section == "Contents") {
      p->page.objects.push_back(std::move(p->object));
    } else if (p->section == "IsTruncated") {
      p->page.truncated = p->text == "true";
    } else if (p->section == "NextContinuationToken") {
      p->page.next_token = p->text;
    }
    p->section.clear();
  } else if (p->depth == 3) {
    if (p->section == "Contents") {
      if (p->field == "Key") {
        p->object.key = p->text;
      } else if (p->field == "ETag") {
        p->object.etag = p->text;
      } else if (p->field == "Size" && !absl::SimpleAtoi(p->text, &p->object.size) &&
                 p->error.empty()) {
        p->error = absl::StrCat("an object's <Size> is '", p->text.substr(0, 64),
                                "', not a number of bytes");
      }
    } else if (p->section == "CommonPrefixes" && p->field == "Prefix") {
      p->page.common_prefixes.push_back(p->text);
    }
  }
  p->text.clear();
  --p->depth;
}

struct FreeParser {
  void operator()(XML_Parser parser) const { XML_ParserFree(parser); }
};

}  // namespace

absl::StatusOr<ListPage> ParseListObjectsV2(absl::string_view xml) {
  std::unique_ptr<XML_ParserStruct, FreeParser> parser(XML_ParserCreate("UTF-8"));
  if (parser == nullptr) return absl::ResourceExhaustedError("cannot create an XML parser");
  Parser p;
  XML_SetUserData(parser.get(), &p);
  XML_SetElementHandler(parser.get(), &OnStart, &OnEnd);
  XML_SetCharacterDataHandler(parser.get(), &OnText);
  // Fed in pieces: XML_Parse takes an int length.
  constexpr size_t kPiece = 1 << 20;
  XML_Status status = XML_STATUS_OK;
  for (size_t at = 0; status == XML_STATUS_OK && p.error.empty();) {
    const size_t n = std::min(kPiece, xml.size() - at);
    const bool last = at + n == xml.size();
    status = XML_Parse(parser.get(), xml.data() + at, static_cast<int>(n), last ? 1 : 0);
    at += n;
    if (last) break;
  }
  if (status != XML_STATUS_OK) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the object listing is not XML: ", XML_ErrorString(XML_GetErrorCode(parser.get())),
        " at line ", XML_GetCurrentLineNumber(parser.get())));
  }
  if (!p.error.empty())
    return absl::InvalidArgumentError(absl::StrCat("object listing: ", p.error));
  if (!p.root_seen) return absl::InvalidArgumentError("the object listing is empty");
  if (p.page.truncated && p.page.next_token.empty()) {
    return absl::InvalidArgumentError(
        "the object listing is truncated but gives no NextContinuationToken");
  }
  return std::move(p.page);
}

}  // namespace ferry
