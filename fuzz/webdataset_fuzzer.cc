// libFuzzer harness: WebDataset grouping over a hostile shard. The input is written to a
// memfd and opened as a one-shard dataset: indexing groups members into samples (basenames,
// image and label keys), then the first samples are read and decoded as a worker would.
// Any input is refused with a status or served; nothing crashes.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/random.h"
#include "server/dataset/webdataset_source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_create("shard.tar", MFD_CLOEXEC);
  if (fd < 0) return 0;
  size_t done = 0;
  while (done < size) {
    const ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ferry::v1::WebDataset spec;
  spec.add_shards("/proc/self/fd/" + std::to_string(fd));
  ferry::DecodeLimits limits;
  limits.max_image_pixels = 1 << 20;
  auto source = ferry::WebDatasetSource::Create(
      spec, ferry::ImageTransform::RandomResizedCrop(8, true), limits);
  if (source.ok()) {
    auto scratch = (*source)->NewScratch();
    std::vector<std::vector<uint8_t>> buffers;
    std::vector<uint8_t*> rows;
    for (const ferry::FieldLayout& f : (*source)->fields()) buffers.emplace_back(f.row_bytes);
    for (auto& b : buffers) rows.push_back(b.data());
    std::vector<int64_t> order;
    (*source)->StreamOrder(7, 0, true, &order);
    for (int64_t i = 0; i < std::min<int64_t>((*source)->size(), 4); ++i) {
      (void)(*source)->Fill(i, ferry::MixSeed(7, 0, static_cast<uint64_t>(i)), rows, scratch.get());
      (void)(*source)->Describe(i);
    }
  }
  close(fd);
  return 0;
}
