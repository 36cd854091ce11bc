#include "server/dataset/npy_source.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/dataset/mapped_file.h"
#include "server/dataset/record_source.h"

namespace ferry {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;
// Nesting deeper than this is not a header numpy writes (structured dtypes nest a few levels).
constexpr int kMaxDepth = 32;

// A value of the Python literal subset that .npy headers are written in.
struct Literal {
  enum class Kind { kString, kInt, kBool, kNone, kTuple, kList, kDict };
  Kind kind = Kind::kNone;
  std::string text;            // kString
  int64_t number = 0;          // kInt; kBool: 0 or 1
  std::vector<Literal> items;  // kTuple, kList; kDict: key, value, key, value, ...
};

// Recursive descent over `text`; errors are INVALID_ARGUMENT with what was wrong and the
// byte offset, for the caller to wrap. Bounded by kMaxDepth and the text's length.
class LiteralParser {
 public:
  explicit LiteralParser(absl::string_view text) : text_(text) {}

  // One value spanning the whole text (whitespace around it allowed).
  absl::StatusOr<Literal> ParseAll() {
    FERRY_ASSIGN_OR_RETURN(Literal value, Value(0));
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after the dict");
    return value;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(what, " at header byte ", pos_));
  }

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  static bool IsNameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  }

  absl::StatusOr<Literal> Value(int depth) {
    if (depth > kMaxDepth) return Error("nesting too deep");
    SkipSpace();
    if (pos_ >= text_.size()) return Error("header ends where a value was expected");
    const char c = text_[pos_];
    if (c == '{') return Sequence(depth, '}', Literal::Kind::kDict);
    if (c == '(') return Sequence(depth, ')', Literal::Kind::kTuple);
    if (c == '[') return Sequence(depth, ']', Literal::Kind::kList);
    if (c == '\'' || c == '"') return String();
    if (c == '-' || c == '+' || (c >= '0' && c <= '9')) return Int();
    if (IsNameChar(c)) return Name();
    return Error(
        absl::StrCat("unexpected character '", absl::CHexEscape(text_.substr(pos_, 1)), "'"));
  }

  // {k: v, ...}, (a, b, ...), [a, b, ...], each with an optional trailing comma. As in
  // Python, "(x)" without a comma is x itself, not a tuple.
  absl::StatusOr<Literal> Sequence(int depth, char close, Literal::Kind kind) {
    ++pos_;  // the opening bracket
    Literal out;
    out.kind = kind;
    bool comma = false;  // a comma followed the last item
    while (true) {
      SkipSpace();
      if (pos_ >= text_.size()) {
        return Error(absl::StrCat("header ends before the closing '", std::string(1, close), "'"));
      }
      if (text_[pos_] == close) {
        ++pos_;
        break;
      }
      if (!out.items.empty() && !comma) {
        return Error(absl::StrCat("expected ',' or '", std::string(1, close), "'"));
      }
      FERRY_ASSIGN_OR_RETURN(Literal item, Value(depth + 1));
      if (kind == Literal::Kind::kDict) {
        SkipSpace();
        if (pos_ >= text_.size() || text_[pos_] != ':') return Error("expected ':' after a key");
        ++pos_;
        FERRY_ASSIGN_OR_RETURN(Literal value, Value(depth + 1));
        out.items.push_back(std::move(item));
        out.items.push_back(std::move(value));
      } else {
        out.items.push_back(std::move(item));
      }
      SkipSpace();
      comma = pos_ < text_.size() && text_[pos_] == ',';
      if (comma) ++pos_;
    }
    if (kind == Literal::Kind::kTuple && out.items.size() == 1 && !comma) {
      Literal inner = std::move(out.items[0]);
      return inner;
    }
    return out;
  }

  absl::StatusOr<Literal> String() {
    const char quote = text_[pos_++];
    Literal out;
    out.kind = Literal::Kind::kString;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\') {
        if (++pos_ >= text_.size()) break;
      }
      out.text.push_back(text_[pos_++]);
    }
    if (pos_ >= text_.size()) return Error("header ends inside a string");
    ++pos_;  // the closing quote
    return out;
  }

  absl::StatusOr<Literal> Int() {
    Literal out;
    out.kind = Literal::Kind::kInt;
    const bool negative = text_[pos_] == '-';
    if (text_[pos_] == '-' || text_[pos_] == '+') ++pos_;
    const size_t start = pos_;
    uint64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      if (__builtin_mul_overflow(value, 10, &value) ||
          __builtin_add_overflow(value, static_cast<uint64_t>(text_[pos_] - '0'), &value) ||
          value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Error("integer too large");
      }
      ++pos_;
    }
    if (pos_ == start) return Error("expected digits");
    // Python 2 wrote long integers with an L suffix.
    if (pos_ < text_.size() && (text_[pos_] == 'L' || text_[pos_] == 'l')) ++pos_;
    if (pos_ < text_.size() && IsNameChar(text_[pos_])) return Error("malformed integer");
    out.number = negative ? -static_cast<int64_t>(value) : static_cast<int64_t>(value);
    return out;
  }

  absl::StatusOr<Literal> Name() {
    const size_t start = pos_;
    while (pos_ < text_.size() && IsNameChar(text_[pos_])) ++pos_;
    const absl::string_view name = text_.substr(start, pos_ - start);
    // String prefixes (u'<f4' from Python 2, b'...'): the string itself follows.
    if ((name == "u" || name == "U" || name == "b" || name == "B") && pos_ < text_.size() &&
        (text_[pos_] == '\'' || text_[pos_] == '"')) {
      return String();
    }
    Literal out;
    if (name == "True" || name == "False") {
      out.kind = Literal::Kind::kBool;
      out.number = name == "True" ? 1 : 0;
    } else if (name == "None") {
      out.kind = Literal::Kind::kNone;
    } else {
      pos_ = start;
      return Error(absl::StrCat("unexpected name '", absl::CHexEscape(name), "'"));
    }
    return out;
  }

  const absl::string_view text_;
  size_t pos_ = 0;
};

std::string ShapeLabel(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

struct DescrResult {
  ferry::v1::DType dtype = ferry::v1::DTYPE_UNSPECIFIED;
  size_t itemsize = 0;
};

// Maps a dtype string such as '<f4' to a DType; `fail` builds the file-naming error.
template <typename Fail>
absl::StatusOr<DescrResult> ParseDescr(const std::string& descr, const Fail& fail) {
  char order = '=';
  absl::string_view type = descr;
  if (!type.empty() && (type[0] == '<' || type[0] == '>' || type[0] == '|' || type[0] == '=')) {
    order = type[0];
    type.remove_prefix(1);
  }
  static constexpr struct {
    const char* type;
    ferry::v1::DType dtype;
    size_t itemsize;
  } kSupported[] = {
      {"u1", ferry::v1::UINT8, 1},   {"u2", ferry::v1::UINT16, 2}, {"u4", ferry::v1::UINT32, 4},
      {"i4", ferry::v1::INT32, 4},   {"i8", ferry::v1::INT64, 8},  {"f2", ferry::v1::FLOAT16, 2},
      {"f4", ferry::v1::FLOAT32, 4},
  };
  for (const auto& s : kSupported) {
    if (type != s.type) continue;
    if (order == '>' && s.itemsize > 1) {
      return fail(absl::StrCat("is big-endian (dtype '", descr,
                               "'); ferry serves little-endian data: save it with np.save(path, "
                               "arr.astype(arr.dtype.newbyteorder('<')))"));
    }
    return DescrResult{s.dtype, s.itemsize};
  }
  const std::string shown = absl::CHexEscape(descr);
  if (!type.empty() && type[0] == 'O') {
    return fail(absl::StrCat("holds Python objects (dtype '", shown,
                             "'), which cannot be memory-mapped; save a numeric array, e.g. "
                             "np.save(path, arr.astype(np.float32))"));
  }
  std::string advice;
  if (type == "i1") {
    advice =
        "int8 has no ferry dtype: save it as arr.astype(np.int32), or as arr.view(np.uint8) "
        "to keep one byte per value and view it back as int8 in the trainer";
  } else if (type == "f8") {
    advice = "save it as arr.astype(np.float32)";
  } else if (type == "i2") {
    advice = "save it as arr.astype(np.int32)";
  } else if (type == "u8") {
    advice = "save it as arr.astype(np.int64) if its values fit";
  } else if (type == "b1") {
    advice = "save it as arr.astype(np.uint8)";
  } else {
    advice = "convert it to one of uint8, uint16, uint32, int32, int64, float16, float32";
  }
  return fail(absl::StrCat("has dtype '", shown,
                           "', which ferry cannot serve (it reads |u1 <u2 <u4 <i4 <i8 <f2 <f4); ",
                           advice));
}

}  // namespace

absl::StatusOr<NpyHeader> ParseNpyHeader(absl::Span<const uint8_t> file, absl::string_view path) {
  const auto fail = [&](absl::string_view what) {
    return absl::FailedPreconditionError(absl::StrCat("npy file '", path, "' ", what));
  };
  if (file.size() < kMagicBytes + 2) {
    return fail(absl::StrCat("is ", file.size(),
                             " bytes, too short to be a .npy file (its preamble alone is 10 "
                             "bytes); is it a .npy file?"));
  }
  if (std::memcmp(file.data(), kMagic, kMagicBytes) != 0) {
    return fail(
        "does not start with the .npy magic string \\x93NUMPY; is it a .npy file? (an .npz "
        "archive holds several arrays: np.save the one to serve to its own .npy file)");
  }
  const int major = file[6];
  const int minor = file[7];
  if (major < 1 || major > 3 || minor != 0) {
    return fail(absl::StrCat("has .npy format version ", major, ".", minor,
                             "; ferry reads versions 1.0, 2.0 and 3.0: save it again with "
                             "np.save"));
  }
  // Version 1.0 has a 2-byte header length, 2.0 and 3.0 (UTF-8 header) a 4-byte one.
  const size_t length_bytes = major == 1 ? 2 : 4;
  const size_t start = kMagicBytes + 2 + length_bytes;
  if (file.size() < start) {
    return fail(absl::StrCat("is truncated inside its preamble (", file.size(), " bytes of ", start,
                             "); copy the file again"));
  }
  size_t header_len = 0;
  for (size_t i = 0; i < length_bytes; ++i) {
    header_len |= static_cast<size_t>(file[kMagicBytes + 2 + i]) << (8 * i);
  }
  if (header_len > file.size() - start) {
    return fail(absl::StrCat("has a header length of ", header_len,
                             " bytes, past the end of the file (", file.size() - start,
                             " bytes follow the preamble); the file is truncated: copy it "
                             "again"));
  }
  const absl::string_view header(reinterpret_cast<const char*>(file.data()) + start, header_len);
  absl::StatusOr<Literal> parsed = LiteralParser(header).ParseAll();
  if (!parsed.ok()) {
    return fail(absl::StrCat("has a malformed header (", parsed.status().message(),
                             "); save it again with np.save"));
  }
  if (parsed->kind != Literal::Kind::kDict) {
    return fail("has a header that is not a dict; save it again with np.save");
  }
  const Literal* descr = nullptr;
  const Literal* fortran_order = nullptr;
  const Literal* shape = nullptr;
  for (size_t i = 0; i + 1 < parsed->items.size(); i += 2) {
    const Literal& key = parsed->items[i];
    const Literal* value = &parsed->items[i + 1];
    if (key.kind == Literal::Kind::kString && key.text == "descr") {
      descr = value;
    } else if (key.kind == Literal::Kind::kString && key.text == "fortran_order") {
      fortran_order = value;
    } else if (key.kind == Literal::Kind::kString && key.text == "shape") {
      shape = value;
    } else {
      return fail(
          absl::StrCat("has a header key other than 'descr', 'fortran_order' and "
                       "'shape' (key ",
                       i / 2 + 1, " of ", parsed->items.size() / 2,
                       "; numpy.load refuses others too): save it again with np.save"));
    }
  }
  for (const auto& [value, name] :
       {std::pair{descr, "descr"}, std::pair{fortran_order, "fortran_order"},
        std::pair{shape, "shape"}}) {
    if (value == nullptr) {
      return fail(absl::StrCat("has no '", name, "' in its header; save it again with np.save"));
    }
  }
  if (descr->kind == Literal::Kind::kList) {
    return fail(
        "has a structured dtype (a list of fields); ferry serves plain numeric arrays: save "
        "each field to its own .npy, e.g. np.save(path, np.ascontiguousarray(arr['x']))");
  }
  if (descr->kind != Literal::Kind::kString) {
    return fail("has a header 'descr' that is not a dtype string; save it again with np.save");
  }
  FERRY_ASSIGN_OR_RETURN(DescrResult type, ParseDescr(descr->text, fail));
  if (fortran_order->kind != Literal::Kind::kBool) {
    return fail(
        "has a header 'fortran_order' that is not True or False; save it again with np.save");
  }
  NpyHeader out;
  out.dtype = type.dtype;
  out.data_offset = start + header_len;
  bool shape_ok = shape->kind == Literal::Kind::kTuple;
  for (const Literal& d : shape->items) {
    shape_ok = shape_ok && d.kind == Literal::Kind::kInt && d.number >= 0;
    if (shape_ok) out.shape.push_back(d.number);
  }
  if (!shape_ok) {
    return fail(
        "has a header 'shape' that is not a tuple of non-negative integers; save it again "
        "with np.save");
  }
  if (out.shape.empty()) {
    return fail(
        "holds a 0-d array (shape ()), which has no rows to serve: save an array with at "
        "least one axis, e.g. np.save(path, np.atleast_1d(x))");
  }
  // One axis reads the same in either order.
  if (fortran_order->number != 0 && out.shape.size() >= 2) {
    return fail(absl::StrCat(
        "is stored in Fortran order (fortran_order: True, shape ", ShapeLabel(out.shape),
        "); ferry reads rows in C order: save it with np.save(path, np.ascontiguousarray(arr))"));
  }
  size_t data_bytes = type.itemsize;
  bool overflow = false;
  for (int64_t d : out.shape) {
    overflow =
        overflow || __builtin_mul_overflow(data_bytes, static_cast<uint64_t>(d), &data_bytes);
  }
  const size_t available = file.size() - out.data_offset;
  const std::string array =
      absl::StrCat("shape ", ShapeLabel(out.shape), ", dtype '", descr->text, "'");
  if (overflow || data_bytes > available) {
    return fail(absl::StrCat("is truncated: its header (", array, ") says the array is ",
                             overflow ? std::string("over 2^64") : absl::StrCat(data_bytes),
                             " bytes, but ", available,
                             " bytes follow the header; copy the file again"));
  }
  if (data_bytes < available) {
    return fail(absl::StrCat("has ", available - data_bytes, " bytes after its array (", array,
                             ", ", data_bytes,
                             " bytes); is it several arrays written to one file? np.save each "
                             "array to its own file"));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<SampleSource>> OpenNpySource(const ferry::v1::NpyDataset& spec,
                                                            RowStores stores, const DatasetFs& fs) {
  if (spec.path().empty()) {
    return absl::InvalidArgumentError("dataset.npy.path must be set to a .npy file");
  }
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, fs.MapFile(spec.path()));
  FERRY_ASSIGN_OR_RETURN(NpyHeader header, ParseNpyHeader(file->bytes(), spec.path()));
  if (header.shape[0] == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("npy file '", spec.path(), "' has no rows (shape ", ShapeLabel(header.shape),
                     "); dataset.npy.path must name an array with at least one row"));
  }
  RecordLayout layout;
  layout.data_offset = header.data_offset;
  layout.dtype = header.dtype;
  layout.shape.assign(header.shape.begin() + 1, header.shape.end());
  layout.num_records = header.shape[0];
  for (int64_t d : layout.shape) {
    if (d == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "npy file '", spec.path(), "' has empty rows (shape ", ShapeLabel(header.shape),
          "): a sample would hold no values; save an array whose axes after the first are "
          "all at least 1"));
    }
  }
  FERRY_ASSIGN_OR_RETURN(auto source,
                         RecordSource::FromLayout(std::move(file), layout, "row", stores));
  return std::unique_ptr<SampleSource>(std::move(source));
}

}  // namespace ferry
