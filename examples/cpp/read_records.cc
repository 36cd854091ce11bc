// Reads one epoch of a file of little-endian int64 records through ferryd and checks that
// every record arrives exactly once: the smallest useful program against the C++ client.
//   ferry_read_records ADDRESS FILE [BATCH_SIZE]
// ADDRESS is ferryd's socket ("" for the default one). Prints "read N records in B batches"
// and exits 0, or prints the error and exits 1.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ferry/client.h"

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "ferry_read_records: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s ADDRESS FILE [BATCH_SIZE]\n", argv[0]);
    return 2;
  }
  const uint32_t batch_size = argc > 3 ? static_cast<uint32_t>(std::atoi(argv[3])) : 16;

  auto client = ferry::Client::Connect(argv[1]);
  if (!client.ok()) return Fail(client.status());

  // A spec sets what it needs; ferryd applies the defaults of the rest (ferry.proto).
  ferry::v1::JobSpec spec;
  spec.mutable_dataset()->mutable_records()->set_path(argv[2]);
  spec.mutable_dataset()->mutable_records()->set_dtype(ferry::v1::INT64);
  spec.set_batch_size(batch_size);
  spec.set_shuffle(true);
  spec.set_seed(1);
  auto job = (*client)->CreateJob(/*name=*/"", spec);
  if (!job.ok()) return Fail(job.status());

  auto consumer = (*client)->Attach(job->id(), /*rank=*/0);
  if (!consumer.ok()) return Fail(consumer.status());
  if (absl::Status s = (*consumer)->StartEpoch(0, 0); !s.ok()) return Fail(s);

  std::vector<int> seen(static_cast<size_t>(job->num_samples()), 0);
  int64_t records = 0, batches = 0;
  for (;;) {
    auto next = (*consumer)->Next();
    if (!next.ok()) return Fail(next.status());
    if (!next->has_value()) break;  // end of the epoch
    ferry::Batch& batch = **next;
    const ferry::BatchField* data = batch.field("data");
    if (data == nullptr) return Fail(absl::InternalError("batch has no field 'data'"));
    for (uint32_t i = 0; i < batch.num_samples(); ++i) {
      int64_t value;
      std::memcpy(&value, static_cast<const char*>(data->data) + 8 * i, 8);
      if (value < 0 || value >= job->num_samples() || seen[value]++ != 0) {
        return Fail(absl::DataLossError("record value " + std::to_string(value) +
                                        " is out of range or arrived twice"));
      }
    }
    records += batch.num_samples();
    ++batches;
    if (absl::Status s = batch.Release(); !s.ok()) return Fail(s);
  }
  consumer->reset();
  if (absl::Status s = (*client)->DeleteJob(job->id()); !s.ok()) return Fail(s);
  std::printf("read %lld records in %lld batches\n", static_cast<long long>(records),
              static_cast<long long>(batches));
  return records == job->num_samples() ? 0 : 1;
}
