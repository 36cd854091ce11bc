#include "server/dataset/indexed_files.h"

#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/dataset/token_convert.h"

namespace ferry {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

// Megatron-LM's DType codes (megatron/core/datasets/indexed_dataset.py).
const char* DTypeCodeName(uint8_t code) {
  static const char* const kNames[] = {"?",     "uint8",   "int8",    "int16", "int32",
                                       "int64", "float64", "float32", "uint16"};
  return code < 9 ? kNames[code] : "unknown";
}

}  // namespace

absl::StatusOr<IndexedFiles> IndexedFiles::Open(const std::string& prefix, const DatasetFs& fs) {
  const std::string idx_path = prefix + ".idx";
  const std::string bin_path = prefix + ".bin";
  IndexedFiles files;
  FERRY_ASSIGN_OR_RETURN(files.idx_, fs.MapFile(idx_path));
  FERRY_ASSIGN_OR_RETURN(files.bin_, fs.MapFileInRanges(bin_path));
  const absl::Span<const uint8_t> mapped = files.idx_->bytes();
  const std::string what = absl::StrCat("Megatron index '", idx_path, "'");
  if (mapped.size() < kIdxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", mapped.size(), " bytes, shorter than the ", kIdxHeaderBytes,
                     "-byte MMIDIDX header; is it a Megatron .idx, or was it cut short?"));
  }
  // The header is copied out of the mapping under its guard (the file may shrink under it),
  // and parsed from the copy.
  uint8_t header[kIdxHeaderBytes];
  FERRY_RETURN_IF_ERROR(
      files.idx_->Read([&] { std::memcpy(header, mapped.data(), kIdxHeaderBytes); }));
  const absl::Span<const uint8_t> idx(header, kIdxHeaderBytes);
  if (std::memcmp(idx.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     " does not start with the magic \"MMIDIDX\\0\\0\"; it is not a Megatron-LM "
                     "indexed dataset index (or an old lazy/cached format, which is not read)"));
  }
  const uint64_t version = LoadLittleEndian<uint64_t>(idx.data() + 9);
  if (version != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has version ", version, "; only version 1 (Megatron-LM's) is read"));
  }
  const uint8_t code = idx[17];
  if (code == 8) {
    files.token_bytes_ = 2;
  } else if (code == 4) {
    files.token_bytes_ = 4;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has token dtype code ", code, " (", DTypeCodeName(code),
                     "); token datasets are uint16 (code 8) or int32 (code 4)"));
  }
  const uint64_t sequences = LoadLittleEndian<uint64_t>(idx.data() + 18);
  const uint64_t documents = LoadLittleEndian<uint64_t>(idx.data() + 26);
  const uint64_t body = mapped.size() - kIdxHeaderBytes;
  // Checked one at a time so that no product overflows: 12 bytes per sequence (length and
  // pointer), 8 per document index, and optionally 1 per sequence (multimodal modes).
  const bool fits = sequences <= body / 12 && documents <= (body - sequences * 12) / 8;
  const uint64_t expected = fits ? kIdxHeaderBytes + sequences * 12 + documents * 8 : 0;
  if (!fits || (mapped.size() != expected && mapped.size() != expected + sequences)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is ", mapped.size(), " bytes, but its header's ", sequences, " sequences and ",
        documents, " document indices need ",
        fits ? absl::StrCat(expected, " (or ", expected + sequences, " with sequence modes)")
             : std::string("more"),
        "; the index is truncated or corrupt: rebuild it"));
  }
  files.num_sequences_ = static_cast<int64_t>(sequences);
  files.num_documents_ = static_cast<int64_t>(documents);
  if (sequences == 0) {
    return absl::FailedPreconditionError(absl::StrCat(what, " holds no sequence"));
  }
  // The entries checked here, read under the mapping's guard.
  const int64_t last = files.num_sequences_ - 1;
  int64_t first_document = 0, last_document = 0, first_pointer = 0, last_pointer = 0,
          last_length = 0;
  FERRY_RETURN_IF_ERROR(files.idx_->Read([&] {
    if (documents > 0) {
      first_document = files.DocumentIndex(0);
      last_document = files.DocumentIndex(files.num_documents_ - 1);
    }
    first_pointer = files.SequencePointer(0);
    last_pointer = files.SequencePointer(last);
    last_length = files.SequenceLength(last);
  }));
  if (documents < 2 || first_document != 0 || last_document != files.num_sequences_) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, "'s document indices must run from 0 to its sequence count ", sequences, " (got ",
        documents, " entries",
        documents > 0 ? absl::StrCat(", first ", first_document, ", last ", last_document) : "",
        "); the index is corrupt: rebuild it"));
  }
  const int64_t bin_bytes = static_cast<int64_t>(files.bin_->bytes().size());
  if (first_pointer != 0 || last_pointer < 0 || last_length < 0 || last_pointer > bin_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        " is corrupt: its sequences must start at byte 0 of the .bin and lie within it "
        "(first pointer ",
        first_pointer, ", last pointer ", last_pointer, ", last length ", last_length,
        ", .bin bytes ", bin_bytes, "); rebuild it"));
  }
  files.used_bytes_ = last_pointer + last_length * static_cast<int64_t>(files.token_bytes_);
  if (files.used_bytes_ > bin_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Megatron data '", bin_path, "' is ", bin_bytes, " bytes, but its index '", idx_path,
        "' needs ", files.used_bytes_, "; the .bin is truncated (or belongs to another .idx)"));
  }
  files.prefix_ = prefix;
  return files;
}

int64_t IndexedFiles::SequenceLength(int64_t s) const {
  return LoadLittleEndian<int32_t>(idx_->bytes().data() + kIdxHeaderBytes + s * 4);
}

int64_t IndexedFiles::SequencePointer(int64_t s) const {
  return LoadLittleEndian<int64_t>(idx_->bytes().data() + kIdxHeaderBytes + num_sequences_ * 4 +
                                   s * 8);
}

int64_t IndexedFiles::DocumentIndex(int64_t d) const {
  return LoadLittleEndian<int64_t>(idx_->bytes().data() + kIdxHeaderBytes + num_sequences_ * 12 +
                                   d * 8);
}

bool IndexedFiles::SequenceFits(int64_t s) const {
  const int64_t pointer = SequencePointer(s);
  const int64_t length = SequenceLength(s);
  const int64_t next = s + 1 < num_sequences_ ? SequencePointer(s + 1) : used_bytes_;
  return length >= 0 && pointer >= 0 && pointer <= used_bytes_ &&
         pointer + length * static_cast<int64_t>(token_bytes_) == next;
}

absl::StatusOr<std::vector<int32_t>> IndexedFiles::SequenceLengths() const {
  std::vector<int32_t> lengths(static_cast<size_t>(num_sequences_));
  FERRY_RETURN_IF_ERROR(idx_->Read([&] {
    std::memcpy(lengths.data(), idx_->bytes().data() + kIdxHeaderBytes, lengths.size() * 4);
  }));
  for (size_t s = 0; s < lengths.size(); ++s) {
    if (lengths[s] < 0) {
      return absl::DataLossError(absl::StrCat("Megatron index '", idx_->path(),
                                              "' is corrupt: sequence ", s, " has length ",
                                              lengths[s], "; rebuild the index"));
    }
  }
  return lengths;
}

}  // namespace ferry
