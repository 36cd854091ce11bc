// megatron_gpt against Megatron-Core's own output: testing/megatron_core/references holds
// what Megatron-Core (commit d98e8a64ddf34856e74b24714e3bedb2f5a39553, its GPTDataset,
// BlendedDataset, BlendedMegatronDatasetBuilder and helpers.cpp) built and yielded for small
// corpora written by its own IndexedDatasetBuilder (testing/megatron_core/README.md says how
// they were made). Every index array and every field of every sample must be equal.
#include <archive.h>
#include <archive_entry.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/dataset/megatron_gpt.h"
#include "server/dataset/megatron_gpt_source.h"
#include "testing/recording_fs.h"

namespace ferry::megatron {
namespace {

const std::string kReferences = FERRY_MEGATRON_REFERENCES;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// One .npy array: dtype (numpy's descr, e.g. "<i8"), shape, raw little-endian bytes.
struct Array {
  std::string descr;
  std::vector<int64_t> shape;
  std::string data;

  template <typename T>
  T At(size_t i) const {
    const char kind = descr[1];
    const int size = std::stoi(descr.substr(2));
    const char* p = data.data() + i * static_cast<size_t>(size);
    auto load = [p](auto v) {
      std::memcpy(&v, p, sizeof v);
      return static_cast<T>(v);
    };
    if (kind == 'f') return size == 4 ? load(float{}) : load(double{});
    if (kind == 'b') return load(uint8_t{});
    if (kind == 'u') return size == 4 ? load(uint32_t{}) : load(uint64_t{});
    switch (size) {
      case 2:
        return load(int16_t{});
      case 4:
        return load(int32_t{});
      default:
        return load(int64_t{});
    }
  }
  size_t size() const { return data.size() / static_cast<size_t>(std::stoi(descr.substr(2))); }
  template <typename T>
  std::vector<T> All() const {
    std::vector<T> out(size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = At<T>(i);
    return out;
  }
};

Array ParseNpy(const std::string& bytes) {
  // "\x93NUMPY", version, header length (2 bytes in version 1, 4 after), the header dict.
  const bool v1 = bytes[6] == 1;
  const size_t header_len = v1 ? static_cast<uint8_t>(bytes[8]) | static_cast<uint8_t>(bytes[9])
                                                                      << 8
                               : *reinterpret_cast<const uint32_t*>(bytes.data() + 8);
  const size_t start = v1 ? 10 : 12;
  const std::string header = bytes.substr(start, header_len);
  Array a;
  const size_t d = header.find("'descr': '") + 10;
  a.descr = header.substr(d, header.find('\'', d) - d);
  const size_t s = header.find("'shape': (") + 10;
  std::stringstream shape(header.substr(s, header.find(')', s) - s));
  std::string dim;
  while (std::getline(shape, dim, ',')) {
    if (dim.find_first_not_of(' ') != std::string::npos) a.shape.push_back(std::stoll(dim));
  }
  a.data = bytes.substr(start + header_len);
  return a;
}

// Every array of a .npz, by name without ".npy".
std::map<std::string, Array> ReadNpz(const std::string& path) {
  std::map<std::string, Array> out;
  std::unique_ptr<archive, int (*)(archive*)> a(archive_read_new(), archive_read_free);
  archive_read_support_format_zip(a.get());
  EXPECT_EQ(archive_read_open_filename(a.get(), path.c_str(), 1 << 16), ARCHIVE_OK) << path;
  archive_entry* entry;
  while (archive_read_next_header(a.get(), &entry) == ARCHIVE_OK) {
    std::string name = archive_entry_pathname(entry);
    std::string bytes(static_cast<size_t>(archive_entry_size(entry)), '\0');
    EXPECT_EQ(archive_read_data(a.get(), bytes.data(), bytes.size()),
              static_cast<la_ssize_t>(bytes.size()));
    out[name.substr(0, name.size() - 4)] = ParseNpy(bytes);
  }
  return out;
}

// A Megatron indexed dataset (MMIDIDX version 1), read whole: sequence lengths and tokens.
struct Corpus {
  std::vector<int32_t> sizes;
  std::vector<int64_t> starts;  // token offset of each sequence
  std::vector<int64_t> tokens;
};

Corpus ReadCorpus(const std::string& name) {
  const std::string idx = ReadFile(kReferences + "/corpora/" + name + ".idx");
  const std::string bin = ReadFile(kReferences + "/corpora/" + name + ".bin");
  Corpus c;
  uint64_t count;
  std::memcpy(&count, idx.data() + 18, 8);
  const uint8_t code = static_cast<uint8_t>(idx[17]);
  c.sizes.resize(count);
  std::memcpy(c.sizes.data(), idx.data() + 34, count * 4);
  const int width = code == 8 ? 2 : 4;  // uint16 or int32 ids
  for (size_t i = 0; i < bin.size() / static_cast<size_t>(width); ++i) {
    if (width == 2) {
      uint16_t v;
      std::memcpy(&v, bin.data() + 2 * i, 2);
      c.tokens.push_back(v);
    } else {
      int32_t v;
      std::memcpy(&v, bin.data() + 4 * i, 4);
      c.tokens.push_back(v);
    }
  }
  int64_t at = 0;
  for (int32_t s : c.sizes) {
    c.starts.push_back(at);
    at += s;
  }
  return c;
}

struct Case {
  std::string npz;
  std::string corpus;
  std::string split = "1,0,0";
  std::vector<int64_t> builder_sizes;  // train, valid, test samples asked for
  GptSampleOptions sample;
};

GptSampleOptions Options(int32_t seq_len = 8) {
  GptSampleOptions o;
  o.sequence_length = seq_len;
  o.eod_token = 2;  // the references' tokenizer
  o.pad_token = 1;
  return o;
}

// Reads tokens of the corpus's sequences, as GptSampleText asks.
auto Reader(const Corpus& corpus) {
  return [&corpus](int32_t seq, int64_t offset, int64_t length, std::vector<int64_t>* out) {
    const int64_t begin = corpus.starts[static_cast<size_t>(seq)] + offset;
    const int64_t end = length < 0 ? corpus.starts[static_cast<size_t>(seq)] +
                                         corpus.sizes[static_cast<size_t>(seq)]
                                   : begin + length;
    out->insert(out->end(), corpus.tokens.begin() + begin, corpus.tokens.begin() + end);
  };
}

// Sample `i` of a GPTDataset made by ferry equals row `row` of the arrays under `prefix`.
void CheckSample(const Corpus& corpus, const GptIndex& index, int64_t i,
                 const std::map<std::string, Array>& ref, const std::string& prefix, int64_t row,
                 const GptSampleOptions& o) {
  SCOPED_TRACE(prefix + " row " + std::to_string(row));
  const int64_t n = o.sequence_length;
  std::vector<int64_t> text, t(n), l(n), p(n);
  std::vector<float> loss(n);
  std::unique_ptr<bool[]> mask(new bool[static_cast<size_t>(n * n)]);
  GptSampleText(index, i, o.sequence_length, o.add_extra_token_to_sequence, o.pad_token,
                Reader(corpus), &text);
  MakeGptSample(text, o, t.data(), l.data(), loss.data(), p.data(), mask.get());
  for (int64_t j = 0; j < n; ++j) {
    const size_t at = static_cast<size_t>(row * n + j);
    ASSERT_EQ(t[j], ref.at(prefix + "tokens").At<int64_t>(at)) << "token " << j;
    ASSERT_EQ(l[j], ref.at(prefix + "labels").At<int64_t>(at)) << "label " << j;
    ASSERT_EQ(loss[j], ref.at(prefix + "loss_mask").At<float>(at)) << "loss_mask " << j;
    ASSERT_EQ(p[j], ref.at(prefix + "position_ids").At<int64_t>(at)) << "position_id " << j;
  }
  for (int64_t k = 0; k < n * n; ++k) {
    ASSERT_EQ(mask[k],
              ref.at(prefix + "attention_mask").At<bool>(static_cast<size_t>(row * n * n + k)))
        << "attention_mask " << k / n << "," << k % n;
  }
}

// One GPTDataset (a split of a corpus, or a blend's source) made by ferry: its index arrays
// equal those under `prefix`; with `samples`, every sample equals its row there too.
GptIndex CheckGpt(const Corpus& corpus, const std::map<std::string, Array>& ref,
                  const std::string& prefix, std::pair<int64_t, int64_t> range, int64_t num_samples,
                  const GptSampleOptions& o, bool samples) {
  SCOPED_TRACE(prefix);
  std::vector<int32_t> documents;
  for (int64_t d = range.first; d < range.second; ++d) documents.push_back(static_cast<int32_t>(d));
  absl::StatusOr<GptIndex> index =
      BuildGptIndex(corpus.sizes, documents,
                    {.sequence_length = o.sequence_length,
                     .num_samples = num_samples,
                     .seed = 1234,
                     .add_extra_token_to_sequence = o.add_extra_token_to_sequence});
  EXPECT_TRUE(index.ok()) << index.status();
  if (!index.ok()) return GptIndex();
  EXPECT_EQ(index->document_index, ref.at(prefix + "document_index").All<int32_t>());
  EXPECT_EQ(index->sample_index, ref.at(prefix + "sample_index").All<int64_t>());
  EXPECT_EQ(index->shuffle_index, ref.at(prefix + "shuffle_index").All<int64_t>());
  if (samples) {
    EXPECT_EQ(ref.at(prefix + "tokens").shape[0], index->samples());
    for (int64_t i = 0; i < index->samples(); ++i) {
      CheckSample(corpus, *index, i, ref, prefix, i, o);
    }
  }
  return *std::move(index);
}

TEST(MegatronGptReferenceTest, GptDatasetsMatchMegatronCore) {
  GptSampleOptions reset = Options();
  reset.reset_position_ids = reset.reset_attention_mask = reset.eod_mask_loss = true;
  GptSampleOptions no_extra = Options();
  no_extra.add_extra_token_to_sequence = false;
  const Case cases[] = {
      {"a_one_seq_per_doc", "one_seq_per_doc", "1,0,0", {20, 0, 0}, Options()},
      {"b_multi_seq_per_doc", "multi_seq_per_doc", "1,0,0", {11, 0, 0}, Options()},
      {"c_empty_and_1tok_docs", "edge_docs", "1,0,0", {12, 0, 0}, Options()},
      {"d_reset_flags", "multi_seq_per_doc", "1,0,0", {18, 0, 0}, reset},
      {"e_no_extra_token", "one_seq_per_doc", "1,0,0", {11, 0, 0}, no_extra},
      {"f_split_969_30_1", "split_600", "969,30,1", {48, 16, 8}, Options()},
      {"i_int32_corpus", "int32_corpus", "1,0,0", {5, 0, 0}, Options()},
  };
  const char* kSplits[] = {"train", "valid", "test"};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.npz);
    const auto ref = ReadNpz(kReferences + "/" + c.npz + ".npz");
    const Corpus corpus = ReadCorpus(c.corpus);
    absl::StatusOr<std::array<SplitRange, 3>> ranges =
        SplitRanges(c.split, static_cast<int64_t>(corpus.sizes.size()));
    ASSERT_TRUE(ranges.ok()) << ranges.status();
    for (int k = 0; k < 3; ++k) {
      if (!(*ranges)[k].has_value()) {
        EXPECT_EQ(ref.count(std::string(kSplits[k]) + "/document_index"), 0u);
        continue;
      }
      CheckGpt(corpus, ref, std::string(kSplits[k]) + "/", *(*ranges)[k], c.builder_sizes[k],
               c.sample, /*samples=*/true);
    }
  }
}

TEST(MegatronGptReferenceTest, SplitStringsCutWhereMegatronCuts) {
  auto ranges = SplitRanges("969,30,1", 600);
  ASSERT_TRUE(ranges.ok());
  EXPECT_EQ((*ranges)[0], std::make_pair(int64_t{0}, int64_t{581}));
  EXPECT_EQ((*ranges)[1], std::make_pair(int64_t{581}, int64_t{599}));
  EXPECT_EQ((*ranges)[2], std::make_pair(int64_t{599}, int64_t{600}));
  auto train_only = SplitRanges("1", 10);
  ASSERT_TRUE(train_only.ok());
  EXPECT_FALSE((*train_only)[1].has_value());
  EXPECT_FALSE(SplitRanges("0,0,0", 10).ok());
  EXPECT_FALSE(SplitRanges("1,1,1,1", 10).ok());
  EXPECT_FALSE(SplitRanges("1.2.3", 10).ok());
}

TEST(MegatronGptReferenceTest, BlendsMatchMegatronCore) {
  struct Blend {
    std::string npz;
    std::vector<double> weights;
    std::string split;
    std::vector<int64_t> sizes;
  };
  const Blend blends[] = {
      {"g1_blend3", {0.7, 0.2, 0.1}, "90,10,0", {40, 8, 0}},
      {"g2_blend9", {3, 1.5, 0.25, 7, 2, 0.5, 1, 4.75, 0.1}, "1,0,0", {64, 0, 0}},
  };
  const char* kSplits[] = {"train", "valid", "test"};
  for (const Blend& b : blends) {
    SCOPED_TRACE(b.npz);
    const auto ref = ReadNpz(kReferences + "/" + b.npz + ".npz");
    // The builder normalises the weights, BlendedDataset normalises them again.
    const std::vector<double> once = Normalize(b.weights);
    const std::vector<double> twice = Normalize(once);
    for (int k = 0; k < 3; ++k) {
      const std::string split = kSplits[k];
      if (ref.count(split + "/dataset_index") == 0) continue;
      SCOPED_TRACE(split);
      EXPECT_EQ(twice, ref.at(split + "/weights_final").All<double>());
      const std::vector<int64_t> targets = BlendSourceSamples(once, b.sizes[k], 0.0);
      const std::vector<int64_t> built = BlendSourceSamples(once, b.sizes[k], 0.005);
      int64_t size = 0;
      for (int64_t t : targets) size += t;
      std::vector<int16_t> source;
      std::vector<int64_t> sample;
      BuildBlendingIndices(twice, size, &source, &sample);
      EXPECT_EQ(source, ref.at(split + "/dataset_index").All<int16_t>());
      EXPECT_EQ(sample, ref.at(split + "/dataset_sample_index").All<int64_t>());
      std::vector<Corpus> corpora;
      std::vector<GptIndex> sources;
      for (size_t d = 0; d < b.weights.size(); ++d) {
        corpora.push_back(ReadCorpus("blend_src" + std::to_string(d)));
        auto ranges = SplitRanges(b.split, static_cast<int64_t>(corpora[d].sizes.size()));
        ASSERT_TRUE(ranges.ok());
        sources.push_back(CheckGpt(corpora[d], ref, split + "/ds" + std::to_string(d) + "/",
                                   *(*ranges)[k], built[d], Options(), /*samples=*/false));
      }
      // Sample j of the blend is sample dataset_sample_index[j] of source dataset_index[j].
      ASSERT_EQ(ref.at(split + "/tokens").shape[0], size);
      for (int64_t j = 0; j < size; ++j) {
        const size_t d = static_cast<size_t>(source[static_cast<size_t>(j)]);
        CheckSample(corpora[d], sources[d], sample[static_cast<size_t>(j)], ref, split + "/", j,
                    Options());
      }
    }
  }
}

// The `megatron_gpt` dataset kind end to end: MegatronGptSource, opened on the corpora's
// files as ferryd opens them, fills every row of every split equal to Megatron-Core's
// sample of the same index, field for field.
struct SourceCase {
  std::string npz;
  std::vector<std::string> corpora;
  std::vector<double> weights;
  std::string split;
  std::vector<int64_t> sizes;  // train, valid, test
  bool reset = false;
  bool no_extra = false;
};

ferry::v1::MegatronGptDataset SpecOf(const SourceCase& c, int split) {
  ferry::v1::MegatronGptDataset spec;
  for (const std::string& corpus : c.corpora) {
    spec.add_path_prefixes(kReferences + "/corpora/" + corpus);
  }
  for (double w : c.weights) spec.add_weights(w);
  spec.set_sequence_length(8);
  spec.set_split(c.split);
  spec.set_split_name(static_cast<ferry::v1::MegatronGptDataset::Split>(split));
  spec.set_num_samples(static_cast<uint64_t>(c.sizes[static_cast<size_t>(split)]));
  spec.set_random_seed(1234);
  spec.set_eod_token(2);
  spec.set_pad_token(1);
  spec.set_reset_position_ids(c.reset);
  spec.set_reset_attention_mask(c.reset);
  spec.set_eod_mask_loss(c.reset);
  spec.set_create_attention_mask(true);
  spec.set_no_extra_token(c.no_extra);
  return spec;
}

// Row `i` of field `f` of a source's fill, as T.
template <typename T>
T RowValue(const std::vector<std::vector<uint8_t>>& rows, size_t f, size_t i) {
  T v;
  std::memcpy(&v, rows[f].data() + i * sizeof(T), sizeof(T));
  return v;
}

TEST(MegatronGptReferenceTest, TheMegatronGptDatasetDeliversMegatronCoresSamples) {
  const SourceCase cases[] = {
      {"a_one_seq_per_doc", {"one_seq_per_doc"}, {}, "1,0,0", {20, 0, 0}},
      {"b_multi_seq_per_doc", {"multi_seq_per_doc"}, {}, "1,0,0", {11, 0, 0}},
      {"c_empty_and_1tok_docs", {"edge_docs"}, {}, "1,0,0", {12, 0, 0}},
      {"d_reset_flags", {"multi_seq_per_doc"}, {}, "1,0,0", {18, 0, 0}, /*reset=*/true},
      {"e_no_extra_token", {"one_seq_per_doc"}, {}, "1,0,0", {11, 0, 0}, false, /*no_extra=*/true},
      {"f_split_969_30_1", {"split_600"}, {}, "969,30,1", {48, 16, 8}},
      {"g1_blend3",
       {"blend_src0", "blend_src1", "blend_src2"},
       {0.7, 0.2, 0.1},
       "90,10,0",
       {40, 8, 0}},
      {"g2_blend9",
       {"blend_src0", "blend_src1", "blend_src2", "blend_src3", "blend_src4", "blend_src5",
        "blend_src6", "blend_src7", "blend_src8"},
       {3, 1.5, 0.25, 7, 2, 0.5, 1, 4.75, 0.1},
       "1,0,0",
       {64, 0, 0}},
      {"i_int32_corpus", {"int32_corpus"}, {}, "1,0,0", {5, 0, 0}},
  };
  const char* kSplits[] = {"train", "valid", "test"};
  for (const SourceCase& c : cases) {
    SCOPED_TRACE(c.npz);
    const auto ref = ReadNpz(kReferences + "/" + c.npz + ".npz");
    for (int k = 0; k < 3; ++k) {
      const std::string split = kSplits[k];
      if (ref.count(split + "/tokens") == 0) continue;
      SCOPED_TRACE(split);
      absl::StatusOr<std::unique_ptr<MegatronGptSource>> source =
          MegatronGptSource::Create(SpecOf(c, k), *UnconfinedDatasetFs());
      ASSERT_TRUE(source.ok()) << source.status();
      const int64_t n = 8;
      ASSERT_EQ((*source)->size(), ref.at(split + "/tokens").shape[0]);
      const std::vector<FieldLayout>& fields = (*source)->fields();
      ASSERT_EQ(fields.size(), 6u);  // tokens labels loss_mask position_ids attention_mask index
      std::vector<std::vector<uint8_t>> rows;
      std::vector<uint8_t*> pointers;
      for (const FieldLayout& f : fields) rows.emplace_back(f.row_bytes);
      for (auto& r : rows) pointers.push_back(r.data());
      auto scratch = (*source)->NewScratch();
      for (int64_t i = 0; i < (*source)->size(); ++i) {
        SCOPED_TRACE("sample " + std::to_string(i));
        ASSERT_TRUE((*source)->Fill(i, 0, pointers, scratch.get()).ok());
        for (int64_t j = 0; j < n; ++j) {
          const size_t at = static_cast<size_t>(i * n + j);
          const size_t col = static_cast<size_t>(j);
          ASSERT_EQ(RowValue<int64_t>(rows, 0, col), ref.at(split + "/tokens").At<int64_t>(at));
          ASSERT_EQ(RowValue<int64_t>(rows, 1, col), ref.at(split + "/labels").At<int64_t>(at));
          ASSERT_EQ(RowValue<float>(rows, 2, col), ref.at(split + "/loss_mask").At<float>(at));
          ASSERT_EQ(RowValue<int64_t>(rows, 3, col),
                    ref.at(split + "/position_ids").At<int64_t>(at));
        }
        for (int64_t m = 0; m < n * n; ++m) {
          ASSERT_EQ(
              rows[4][static_cast<size_t>(m)],
              ref.at(split + "/attention_mask").At<uint8_t>(static_cast<size_t>(i * n * n + m)))
              << "attention_mask " << m / n << "," << m % n;
        }
        ASSERT_EQ(RowValue<int64_t>(rows, 5, 0), i);
      }
    }
  }
}

// Read in ranges (a large remote .bin's blocks), the pieces of sequences a sample's Fill
// reads are the ranges RangesOf gives, in order, which the read-ahead fetches before the
// workers: for one sequence a document, several, empty documents and a blend.
TEST(MegatronGptReferenceTest, RangesOfAreThePiecesFillReads) {
  const SourceCase cases[] = {
      {"a_one_seq_per_doc", {"one_seq_per_doc"}, {}, "1,0,0", {20, 0, 0}},
      {"b_multi_seq_per_doc", {"multi_seq_per_doc"}, {}, "1,0,0", {11, 0, 0}},
      {"c_empty_and_1tok_docs", {"edge_docs"}, {}, "1,0,0", {12, 0, 0}},
      {"g1_blend3",
       {"blend_src0", "blend_src1", "blend_src2"},
       {0.7, 0.2, 0.1},
       "90,10,0",
       {40, 8, 0}},
  };
  for (const SourceCase& c : cases) {
    SCOPED_TRACE(c.npz);
    RangesRecordingFs ranged(/*unit=*/8);
    absl::StatusOr<std::unique_ptr<MegatronGptSource>> source =
        MegatronGptSource::Create(SpecOf(c, 0), ranged);
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_TRUE((*source)->ReadsInRanges());
    std::vector<std::vector<uint8_t>> rows;
    std::vector<uint8_t*> pointers;
    for (const FieldLayout& f : (*source)->fields()) rows.emplace_back(f.row_bytes);
    for (auto& r : rows) pointers.push_back(r.data());
    auto scratch = (*source)->NewScratch();
    ranged.TakeHeld();
    int64_t pieces = 0;
    for (int64_t i = 0; i < (*source)->size(); ++i) {
      ASSERT_TRUE((*source)->Fill(i, 0, pointers, scratch.get()).ok());
      std::vector<RangesRecordingFs::Held> read;
      for (RangesRecordingFs::Held& held : ranged.TakeHeld()) {
        if (absl::EndsWith(held.path, ".bin")) read.push_back(std::move(held));
      }
      std::vector<MappedRange> ranges;
      (*source)->RangesOf(i, &ranges);
      std::vector<RangesRecordingFs::Held> want;
      for (const MappedRange& r : ranges) want.push_back({r.file->path(), r.offset, r.length});
      ASSERT_EQ(read, want) << "sample " << i;
      pieces += static_cast<int64_t>(ranges.size());
    }
    EXPECT_GE(pieces, (*source)->size());
    std::vector<MappedRange> none;
    (*source)->RangesOf((*source)->size(), &none);
    EXPECT_TRUE(none.empty());
  }
}

TEST(MegatronGptReferenceTest, TheMegatronGptDatasetRefusesWhatMegatronRefuses) {
  const SourceCase one{"", {"one_seq_per_doc"}, {}, "1,0,0", {20, 0, 0}};
  ferry::v1::MegatronGptDataset spec = SpecOf(one, 0);
  spec.set_sequence_length(1);  // build_sample_idx asserts seq_length > 1 (case h_seq_len_1)
  auto refused = MegatronGptSource::Create(spec, *UnconfinedDatasetFs());
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), testing::HasSubstr("sequence_length"));
  EXPECT_THAT(refused.status().message(), testing::HasSubstr("at least 2"));

  spec = SpecOf(one, 1);  // "1,0,0" builds no valid split
  refused = MegatronGptSource::Create(spec, *UnconfinedDatasetFs());
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), testing::HasSubstr("valid split weight 0"));

  const SourceCase blend{"", {"blend_src0", "blend_src1"}, {0.5, 0.5}, "1,0,0", {0, 0, 0}};
  refused = MegatronGptSource::Create(SpecOf(blend, 0), *UnconfinedDatasetFs());
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), testing::HasSubstr("num_samples must be set"));

  spec = SpecOf(blend, 0);
  spec.set_num_samples(10);
  spec.add_weights(1.0);
  refused = MegatronGptSource::Create(spec, *UnconfinedDatasetFs());
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), testing::HasSubstr("3 entries for 2 path_prefixes"));

  spec = SpecOf(one, 0);
  spec.set_random_seed(uint64_t{1} << 32);
  refused = MegatronGptSource::Create(spec, *UnconfinedDatasetFs());
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), testing::HasSubstr("random_seed"));

  spec = SpecOf(one, 0);
  spec.set_path_prefixes(0, kReferences + "/corpora/no_such_corpus");
  refused = MegatronGptSource::Create(spec, *UnconfinedDatasetFs());
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), testing::HasSubstr("no_such_corpus"));
}

TEST(MegatronGptReferenceTest, CuSeqlensMarkTheSegmentsOfResetAttentionMask) {
  // Case d's samples with cu_seqlens: the segments are where Megatron's reset mask cuts.
  const SourceCase c{"d_reset_flags", {"multi_seq_per_doc"}, {}, "1,0,0", {18, 0, 0}, true};
  ferry::v1::MegatronGptDataset spec = SpecOf(c, 0);
  spec.set_cu_seqlens(true);
  spec.set_output_dtype(ferry::v1::INT32);
  auto source = MegatronGptSource::Create(spec, *UnconfinedDatasetFs());
  ASSERT_TRUE(source.ok()) << source.status();
  const auto ref = ReadNpz(kReferences + "/d_reset_flags.npz");
  const std::vector<FieldLayout>& fields = (*source)->fields();
  ASSERT_EQ(fields[5].name, "cu_seqlens");
  ASSERT_EQ(fields[6].name, "num_seqs");
  std::vector<std::vector<uint8_t>> rows;
  std::vector<uint8_t*> pointers;
  for (const FieldLayout& f : fields) rows.emplace_back(f.row_bytes);
  for (auto& r : rows) pointers.push_back(r.data());
  auto scratch = (*source)->NewScratch();
  const int64_t n = 8;
  for (int64_t i = 0; i < (*source)->size(); ++i) {
    ASSERT_TRUE((*source)->Fill(i, 0, pointers, scratch.get()).ok());
    // Row r's segment starts at the first column it may attend to.
    std::vector<int32_t> starts;
    for (int64_t r = 0; r < n; ++r) {
      int64_t first = 0;
      while (
          ref.at("train/attention_mask").At<bool>(static_cast<size_t>(i * n * n + r * n + first))) {
        ++first;
      }
      if (starts.empty() || starts.back() != first) starts.push_back(static_cast<int32_t>(first));
    }
    const int32_t count = RowValue<int32_t>(rows, 6, 0);
    ASSERT_EQ(count, static_cast<int32_t>(starts.size())) << "sample " << i;
    for (size_t k = 0; k < starts.size(); ++k) {
      EXPECT_EQ(RowValue<int32_t>(rows, 5, k), starts[k]) << "sample " << i;
    }
    for (int64_t k = count; k <= n; ++k) {
      EXPECT_EQ(RowValue<int32_t>(rows, 5, static_cast<size_t>(k)), n) << "sample " << i;
    }
    for (int64_t j = 0; j < n; ++j) {  // INT32 tokens are Megatron's values
      ASSERT_EQ(RowValue<int32_t>(rows, 0, static_cast<size_t>(j)),
                ref.at("train/tokens").At<int64_t>(static_cast<size_t>(i * n + j)));
    }
  }
}

}  // namespace
}  // namespace ferry::megatron
