// What a job over a large token corpus costs before its first batch: opening a Megatron
// indexed dataset and a set of token shards the size of a 100 GB corpus, building
// Megatron-Core's GPTDataset index over it (megatron_gpt), building a blend's interleave, and
// the sampler's first shuffle of that many samples; then the blend's lookup rate and the
// megatron_gpt samples filled per second. The files are sparse (their sizes are real, their blocks
// mostly holes), so what is timed is ferry's own work, not the disk.
//
//   token_index_bench [--dir /tmp] [--gigabytes 100] [--seq_len 2048]
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ferry/v1/ferry.pb.h"
#include "server/dataset/blend_source.h"
#include "server/dataset/indexed_source.h"
#include "server/dataset/megatron_gpt_source.h"
#include "server/dataset/sample_source.h"
#include "server/sampler/sampler.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

void Die(const std::string& what) {
  std::fprintf(stderr, "token_index_bench: %s\n", what.c_str());
  std::exit(1);
}

void WriteAll(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n <= 0) Die(absl::StrCat("write: ", std::strerror(errno)));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void Sparse(const std::string& path, uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) Die("cannot create " + path);
  ::close(fd);
}

// A Megatron .idx of `sequences` one-sequence documents of `length` uint16 tokens each, and a
// sparse .bin of the size it names.
void WriteIndexed(const std::string& prefix, uint64_t sequences, uint32_t length) {
  const int fd = ::open((prefix + ".idx").c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) Die("cannot create " + prefix + ".idx");
  const char magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  WriteAll(fd, magic, 9);
  const uint64_t version = 1, documents = sequences + 1;
  const uint8_t code = 8;  // uint16
  WriteAll(fd, &version, 8);
  WriteAll(fd, &code, 1);
  WriteAll(fd, &sequences, 8);
  WriteAll(fd, &documents, 8);
  constexpr uint64_t kChunk = 1 << 20;
  std::vector<int64_t> buffer(kChunk);
  std::vector<int32_t> lengths(kChunk, static_cast<int32_t>(length));
  for (uint64_t s = 0; s < sequences; s += kChunk) {
    WriteAll(fd, lengths.data(), std::min(kChunk, sequences - s) * 4);
  }
  for (uint64_t s = 0; s < sequences; s += kChunk) {
    const uint64_t n = std::min(kChunk, sequences - s);
    for (uint64_t i = 0; i < n; ++i) buffer[i] = static_cast<int64_t>((s + i) * length * 2);
    WriteAll(fd, buffer.data(), n * 8);
  }
  for (uint64_t d = 0; d < documents; d += kChunk) {
    const uint64_t n = std::min(kChunk, documents - d);
    for (uint64_t i = 0; i < n; ++i) buffer[i] = static_cast<int64_t>(d + i);
    WriteAll(fd, buffer.data(), n * 8);
  }
  ::close(fd);
  Sparse(prefix + ".bin", sequences * length * 2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = std::filesystem::temp_directory_path().string();
  uint64_t gigabytes = 100;
  uint32_t seq_len = 2048;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--dir") {
      dir = argv[i + 1];
    } else if (flag == "--gigabytes") {
      gigabytes = std::stoull(argv[i + 1]);
    } else if (flag == "--seq_len") {
      seq_len = static_cast<uint32_t>(std::stoul(argv[i + 1]));
    } else {
      Die("unknown flag " + flag);
    }
  }
  dir += "/ferry_token_index_bench";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const uint64_t corpus = gigabytes << 30;
  constexpr uint32_t kDocTokens = 1000;  // ~ a web page
  const uint64_t documents = corpus / (2 * kDocTokens);
  std::printf("corpus: %llu GiB of uint16 tokens, seq_len %u\n",
              static_cast<unsigned long long>(gigabytes), seq_len);

  // Megatron indexed: one .idx of `documents` entries.
  auto t = Clock::now();
  WriteIndexed(dir + "/corpus", documents, kDocTokens);
  std::printf("  (writing the %.2f GB .idx took %.1f s; not ferry's cost)\n",
              static_cast<double>(documents * 20 + 34) / 1e9, Seconds(t));
  ferry::v1::IndexedDataset indexed;
  indexed.set_path_prefix(dir + "/corpus");
  indexed.set_seq_len(seq_len);
  indexed.set_position_ids(true);
  indexed.set_cu_seqlens(true);
  t = Clock::now();
  auto source = ferry::IndexedSource::Create(indexed);
  if (!source.ok()) Die(source.status().ToString());
  std::printf("indexed: open %llu documents, %lld samples: %.3f ms\n",
              static_cast<unsigned long long>(documents), static_cast<long long>((*source)->size()),
              Seconds(t) * 1e3);

  // megatron_gpt: Megatron-Core's GPTDataset over the same .idx, one epoch's samples.
  ferry::v1::MegatronGptDataset megatron;
  megatron.add_path_prefixes(dir + "/corpus");
  megatron.set_sequence_length(seq_len);
  megatron.set_split("1");
  megatron.set_random_seed(1234);
  t = Clock::now();
  auto gpt = ferry::MegatronGptSource::Create(megatron, *ferry::UnconfinedDatasetFs());
  if (!gpt.ok()) Die(gpt.status().ToString());
  std::printf("megatron_gpt: GPTDataset index over %llu documents, %lld samples: %.2f s\n",
              static_cast<unsigned long long>(documents), static_cast<long long>((*gpt)->size()),
              Seconds(t));
  {
    auto scratch = (*gpt)->NewScratch();
    std::vector<std::vector<uint8_t>> rows;
    std::vector<uint8_t*> pointers;
    for (const ferry::FieldLayout& f : (*gpt)->fields()) rows.emplace_back(f.row_bytes);
    for (auto& r : rows) pointers.push_back(r.data());
    // 2,000 samples spread over the epoch, their pages touched once first: what is timed is
    // ferry's work per sample, not the page cache filling a sparse file's holes.
    auto fill = [&](int64_t k) {
      const absl::Status st =
          (*gpt)->Fill(k % 2000 * 7919 % (*gpt)->size(), 0, pointers, scratch.get());
      if (!st.ok()) Die(st.ToString());
    };
    for (int64_t k = 0; k < 2000; ++k) fill(k);
    t = Clock::now();
    int64_t filled = 0;
    for (; Seconds(t) < 1.0; ++filled) fill(filled);
    std::printf(
        "megatron_gpt: %.0f samples/s filled on one thread (tokens, labels, loss_mask, "
        "position_ids; pages in memory)\n",
        static_cast<double>(filled) / Seconds(t));
  }
  gpt->reset();

  // Token shards: 128 sparse shards of the same total.
  ferry::v1::JobSpec shards_spec;
  ferry::v1::TokenShardsDataset* shards = shards_spec.mutable_dataset()->mutable_token_shards();
  for (int s = 0; s < 128; ++s) Sparse(absl::StrCat(dir, "/shard-", s, ".bin"), corpus / 128);
  shards->add_shards(dir + "/shard-{0..127}.bin");
  shards->set_token_dtype(ferry::v1::UINT16);
  shards->set_seq_len(seq_len);
  t = Clock::now();
  auto shard_source = ferry::MakeSampleSource(shards_spec, ferry::UnconfinedDatasetFs());
  if (!shard_source.ok()) Die(shard_source.status().ToString());
  std::printf("token_shards: open 128 shards, %lld samples: %.3f ms\n",
              static_cast<long long>((*shard_source)->size()), Seconds(t) * 1e3);

  // A blend of three sources with the corpus' sample count as its epoch.
  const int64_t samples = (*shard_source)->size();
  ferry::v1::JobSpec blend_spec;
  ferry::v1::BlendDataset* blend = blend_spec.mutable_dataset()->mutable_blend();
  const double weights[3] = {0.6, 0.3, 0.1};
  for (double w : weights) {
    ferry::v1::BlendSource* b = blend->add_sources();
    *b->mutable_dataset() = shards_spec.dataset();
    b->set_weight(w);
  }
  blend->set_samples_per_epoch(static_cast<uint64_t>(samples));
  t = Clock::now();
  auto blend_source =
      ferry::BlendSource::Create(blend_spec, ferry::UnconfinedDatasetFs(), ferry::SourceOptions());
  if (!blend_source.ok()) Die(blend_source.status().ToString());
  std::printf("blend: 3 sources, %lld positions: %.3f s (opening the sources included)\n",
              static_cast<long long>(samples), Seconds(t));

  ferry::SamplerOptions options;
  options.num_samples = samples;
  options.batch_size = 8;
  options.world_size = 8;
  options.shuffle = true;
  options.seed = 1;
  const ferry::BlendSource* mapped = blend_source->get();
  options.map_positions = [mapped](int64_t epoch, absl::Span<int64_t> positions) {
    mapped->MapPositions(1, epoch, true, positions);
  };
  auto sampler = ferry::Sampler::Create(options);
  if (!sampler.ok()) Die(sampler.status().ToString());
  std::vector<int64_t> ids;
  t = Clock::now();
  (*sampler)->BatchIndices(0, 0, 0, &ids);
  std::printf("sampler: first batch of an epoch (shuffles %lld positions): %.3f s\n",
              static_cast<long long>(samples), Seconds(t));
  t = Clock::now();
  int64_t looked_up = 0;
  for (int64_t b = 1; b < (*sampler)->batches_per_epoch() && Seconds(t) < 1.0; ++b) {
    (*sampler)->BatchIndices(0, b % 8, b, &ids);
    looked_up += static_cast<int64_t>(ids.size());
  }
  std::printf("sampler + blend lookup: %.2f M samples/s on one thread\n",
              static_cast<double>(looked_up) / Seconds(t) / 1e6);
  // The blend's lookup alone, at positions spread over the epoch.
  t = Clock::now();
  int64_t sum = 0, lookups = 0;
  std::vector<int64_t> batch(256);
  for (; Seconds(t) < 1.0; lookups += 256) {
    for (int64_t i = 0; i < 256; ++i) batch[i] = (lookups + i) * 7919 % samples;
    mapped->MapPositions(1, 0, true, absl::MakeSpan(batch));
    for (int64_t id : batch) sum += id;
  }
  std::printf("blend lookup alone (batches of 256): %.2f M samples/s on one thread (%lld)\n",
              static_cast<double>(lookups) / Seconds(t) / 1e6, static_cast<long long>(sum % 10));
  std::filesystem::remove_all(dir);
  return 0;
}
