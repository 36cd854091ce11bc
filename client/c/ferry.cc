// The C ABI over ferry::Client (see include/ferry/ferry.h). Every entry point converts
// absl::Status into a code plus a per-thread message, and never lets an exception cross the
// C boundary.
#include "ferry/ferry.h"

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/job_limits.h"
#include "common/session_protocol.h"
#include "ferry/client.h"

struct ferry_client {
  std::unique_ptr<ferry::Client> client;
};
struct ferry_consumer {
  std::unique_ptr<ferry::Consumer> consumer;
};
struct ferry_batch {
  ferry::Batch batch;
};

namespace {

thread_local std::string last_error;
thread_local std::string last_error_reason;

// sizeof(ferry_field_t) in ABI 1.0: the members up to and including `nbytes`.
constexpr size_t kFieldV10Size = offsetof(ferry_field_t, nbytes) + sizeof(size_t);

int Fail(const absl::Status& status) {
  last_error = std::string(status.message());
  last_error_reason = ferry::ReasonOf(status);
  return static_cast<int>(status.code());
}

int Report(const absl::Status& status) {
  if (status.ok()) return FERRY_OK;
  return Fail(status);
}

int NullArgument(const char* function, const char* argument) {
  return Fail(absl::InvalidArgumentError(
      absl::StrCat(function, ": argument '", argument, "' must not be NULL")));
}

// Runs `body`, turning escaped exceptions into codes.
template <typename F>
int Guard(const char* function, F&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Fail(absl::ResourceExhaustedError(absl::StrCat(function, ": out of memory")));
  } catch (const std::exception& e) {
    return Fail(absl::InternalError(absl::StrCat(function, ": ", e.what())));
  } catch (...) {
    return Fail(absl::InternalError(absl::StrCat(function, ": unknown exception")));
  }
}

// Returns a malloc'ed copy (callers free it with ferry_free).
char* CopyString(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out == nullptr) throw std::bad_alloc();
  std::memcpy(out, s.data(), s.size() + 1);
  return out;
}

int ReturnJson(const absl::StatusOr<std::string>& json, char** out) {
  if (!json.ok()) return Fail(json.status());
  *out = CopyString(*json);
  return FERRY_OK;
}

// The C ABI's dtype codes are ferry.v1.DType's values, which ferry_dtype_* and
// ferry_batch_field cast between.
constexpr bool SameDType(int code, ferry::v1::DType dtype) {
  return code == static_cast<int>(dtype);
}
static_assert(SameDType(FERRY_DTYPE_UNSPECIFIED, ferry::v1::DTYPE_UNSPECIFIED) &&
              SameDType(FERRY_DTYPE_UINT8, ferry::v1::UINT8) &&
              SameDType(FERRY_DTYPE_UINT16, ferry::v1::UINT16) &&
              SameDType(FERRY_DTYPE_UINT32, ferry::v1::UINT32) &&
              SameDType(FERRY_DTYPE_INT32, ferry::v1::INT32) &&
              SameDType(FERRY_DTYPE_INT64, ferry::v1::INT64) &&
              SameDType(FERRY_DTYPE_FLOAT16, ferry::v1::FLOAT16) &&
              SameDType(FERRY_DTYPE_BFLOAT16, ferry::v1::BFLOAT16) &&
              SameDType(FERRY_DTYPE_FLOAT32, ferry::v1::FLOAT32) &&
              SameDType(FERRY_DTYPE_BOOL, ferry::v1::BOOL));

// The run a ferry_epoch_info_t describes (its consumed ranges checked by the caller).
ferry::EpochProgress ProgressFrom(const ferry_epoch_info_t& info) {
  ferry::EpochProgress p;
  p.positions = info.positions;
  p.world_size = info.world_size;
  p.batch_size = info.batch_size;
  p.drop_last = info.drop_last != 0;
  p.contiguous_ranks = info.contiguous_ranks != 0;
  for (size_t i = 0; i < info.num_consumed; ++i) {
    p.consumed.push_back({info.consumed[i].begin, info.consumed[i].end});
  }
  return p;
}

// Checks a ferry_resume_point_t a caller passes in and copies it.
int PointFrom(const char* fn, const ferry_resume_point_t* in, ferry::ResumePoint* point) {
  if (in == nullptr) return NullArgument(fn, "point");
  if (in->struct_size < sizeof(ferry_resume_point_t)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(fn, ": point->struct_size must be sizeof(ferry_resume_point_t)")));
  }
  if (in->consumed == nullptr && in->num_consumed > 0) return NullArgument(fn, "consumed");
  if (in->resumed_from == nullptr && in->num_resumed_from > 0) {
    return NullArgument(fn, "resumed_from");
  }
  point->epoch = in->epoch;
  point->positions = in->positions;
  for (size_t i = 0; i < in->num_consumed; ++i) {
    point->consumed.push_back({in->consumed[i].begin, in->consumed[i].end});
  }
  point->world_size = in->world_size;
  point->batch_size = in->batch_size;
  point->drop_last = in->drop_last != 0;
  for (size_t i = 0; i < in->num_resumed_from; ++i) {
    point->resumed_from.push_back({in->resumed_from[i].begin, in->resumed_from[i].end});
  }
  point->batches_done = in->batches_done;
  return FERRY_OK;
}

// Writes `ranges` to out[0..capacity) and their number to *count; RESOURCE_EXHAUSTED naming
// `what` when they do not fit.
int RangesTo(const char* fn, const char* what, const std::vector<ferry::EpochRange>& ranges,
             ferry_range_t* out, size_t capacity, size_t* count) {
  *count = ranges.size();
  if (ranges.size() > capacity) {
    return Fail(absl::ResourceExhaustedError(
        absl::StrCat(fn, ": ", ranges.size(), " ranges of ", what, " do not fit in ", capacity)));
  }
  if (out == nullptr && !ranges.empty()) return NullArgument(fn, what);
  for (size_t i = 0; i < ranges.size(); ++i) out[i] = {ranges[i].begin, ranges[i].end};
  return FERRY_OK;
}

}  // namespace

extern "C" {

int ferry_abi_version(void) { return FERRY_ABI_VERSION; }

int ferry_abi_minor(void) { return FERRY_ABI_MINOR; }

uint64_t ferry_job_limit(int limit) {
  switch (limit) {
    case FERRY_LIMIT_BATCH_SIZE:
      return ferry::kMaxBatchSize;
    case FERRY_LIMIT_WORLD_SIZE:
      return ferry::kMaxWorldSize;
    case FERRY_LIMIT_PREFETCH_DEPTH:
      return ferry::kMaxPrefetchDepth;
    case FERRY_LIMIT_JOB_NAME_BYTES:
      return ferry::kMaxJobNameBytes;
    default:
      return 0;
  }
}

const char* ferry_version(void) { return FERRY_VERSION_STRING; }

const char* ferry_last_error(void) { return last_error.c_str(); }

const char* ferry_last_error_reason(void) { return last_error_reason.c_str(); }

const char* ferry_status_name(int code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  if (code < 0 || code >= static_cast<int>(sizeof(kNames) / sizeof(kNames[0]))) {
    return "UNKNOWN";
  }
  return kNames[code];
}

const char* ferry_dtype_name(int dtype) {
  // DTypeName returns views of string literals, hence NUL-terminated.
  return ferry::DTypeName(static_cast<ferry::v1::DType>(dtype)).data();
}

size_t ferry_dtype_size(int dtype) {
  return ferry::DTypeSize(static_cast<ferry::v1::DType>(dtype));
}

void ferry_free(void* p) { std::free(p); }

int ferry_default_address(char** out) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (out == nullptr) return NullArgument(fn, "out");
    *out = CopyString(ferry::DefaultSocketPath());
    return FERRY_OK;
  });
}

int ferry_client_connect(const char* address, ferry_client_t** out) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (out == nullptr) return NullArgument(fn, "out");
    *out = nullptr;
    auto client = ferry::Client::Connect(address == nullptr ? "" : address);
    if (!client.ok()) return Fail(client.status());
    *out = new ferry_client{std::move(*client)};
    return FERRY_OK;
  });
}

void ferry_client_free(ferry_client_t* client) { delete client; }

int ferry_client_daemon_pid(const ferry_client_t* client, int* out) {
  if (client == nullptr) return NullArgument(__func__, "client");
  if (out == nullptr) return NullArgument(__func__, "out");
  *out = client->client->daemon_pid();
  return FERRY_OK;
}

int ferry_client_create_job(ferry_client_t* client, const char* name, const char* spec_json,
                            char** job_json) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (client == nullptr) return NullArgument(fn, "client");
    if (spec_json == nullptr) return NullArgument(fn, "spec_json");
    if (job_json == nullptr) return NullArgument(fn, "job_json");
    *job_json = nullptr;
    return ReturnJson(client->client->CreateJobJson(name == nullptr ? "" : name, spec_json),
                      job_json);
  });
}

int ferry_client_get_job(ferry_client_t* client, const char* job_id, char** json) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (client == nullptr) return NullArgument(fn, "client");
    if (job_id == nullptr) return NullArgument(fn, "job_id");
    if (json == nullptr) return NullArgument(fn, "json");
    *json = nullptr;
    return ReturnJson(client->client->GetJobJson(job_id), json);
  });
}

int ferry_client_list_jobs(ferry_client_t* client, char** json) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (client == nullptr) return NullArgument(fn, "client");
    if (json == nullptr) return NullArgument(fn, "json");
    *json = nullptr;
    return ReturnJson(client->client->ListJobsJson(), json);
  });
}

int ferry_client_delete_job(ferry_client_t* client, const char* job_id) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (client == nullptr) return NullArgument(fn, "client");
    if (job_id == nullptr) return NullArgument(fn, "job_id");
    return Report(client->client->DeleteJob(job_id));
  });
}

int ferry_client_quarantine(ferry_client_t* client, const char* job_id, const int64_t* indices,
                            size_t count, uint32_t* added) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (client == nullptr) return NullArgument(fn, "client");
    if (job_id == nullptr) return NullArgument(fn, "job_id");
    if (indices == nullptr && count > 0) return NullArgument(fn, "indices");
    absl::StatusOr<uint32_t> result =
        client->client->Quarantine(job_id, std::vector<int64_t>(indices, indices + count));
    if (!result.ok()) return Report(result.status());
    if (added != nullptr) *added = *result;
    return 0;
  });
}

int ferry_client_get_status(ferry_client_t* client, char** json) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (client == nullptr) return NullArgument(fn, "client");
    if (json == nullptr) return NullArgument(fn, "json");
    *json = nullptr;
    return ReturnJson(client->client->GetStatusJson(), json);
  });
}

int ferry_client_attach(ferry_client_t* client, const char* job_id, uint32_t rank,
                        ferry_consumer_t** out) {
  return ferry_client_attach_on(client, job_id, rank, nullptr, out);
}

int ferry_client_attach_on(ferry_client_t* client, const char* job_id, uint32_t rank,
                           const char* device, ferry_consumer_t** out) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (client == nullptr) return NullArgument(fn, "client");
    if (job_id == nullptr) return NullArgument(fn, "job_id");
    if (out == nullptr) return NullArgument(fn, "out");
    *out = nullptr;
    auto consumer = client->client->Attach(job_id, rank, device == nullptr ? "" : device);
    if (!consumer.ok()) return Fail(consumer.status());
    *out = new ferry_consumer{std::move(*consumer)};
    return FERRY_OK;
  });
}

int ferry_client_set_held_rank_wait(ferry_client_t* client, double seconds) {
  if (client == nullptr) return NullArgument(__func__, "client");
  if (!(seconds >= 0)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("ferry_client_set_held_rank_wait: ", seconds,
                     " seconds; give 0 or more (0: a held rank is refused at once)")));
  }
  client->client->set_held_rank_wait(absl::Seconds(seconds));
  return FERRY_OK;
}

int ferry_client_set_reattach(ferry_client_t* client, double seconds,
                              ferry_reconnect_fn before_reconnect, void* ctx) {
  if (client == nullptr) return NullArgument(__func__, "client");
  if (!(seconds >= 0)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("ferry_client_set_reattach: ", seconds,
                     " seconds; give 0 or more (0: a consumer whose ferryd went away fails)")));
  }
  std::function<absl::Status()> hook;
  if (before_reconnect != nullptr) {
    hook = [before_reconnect, ctx]() -> absl::Status {
      char error[1024] = {0};
      const int code = before_reconnect(ctx, error, sizeof error);
      if (code == FERRY_OK) return absl::OkStatus();
      error[sizeof error - 1] = '\0';
      return absl::Status(static_cast<absl::StatusCode>(code),
                          error[0] != '\0' ? error : "the reconnect hook failed");
    };
  }
  client->client->set_reattach(absl::Seconds(seconds), std::move(hook));
  return FERRY_OK;
}

void ferry_consumer_free(ferry_consumer_t* consumer) { delete consumer; }

int ferry_consumer_attaches(const ferry_consumer_t* consumer, int64_t* out) {
  if (consumer == nullptr) return NullArgument(__func__, "consumer");
  if (out == nullptr) return NullArgument(__func__, "out");
  *out = consumer->consumer->attaches();
  return FERRY_OK;
}

int ferry_consumer_batches_per_epoch(const ferry_consumer_t* consumer, int64_t* out) {
  if (consumer == nullptr) return NullArgument(__func__, "consumer");
  if (out == nullptr) return NullArgument(__func__, "out");
  *out = consumer->consumer->job().batches_per_epoch();
  return FERRY_OK;
}

int ferry_consumer_num_slots(const ferry_consumer_t* consumer, uint32_t* out) {
  if (consumer == nullptr) return NullArgument(__func__, "consumer");
  if (out == nullptr) return NullArgument(__func__, "out");
  *out = consumer->consumer->num_slots();
  return FERRY_OK;
}

int ferry_consumer_start_epoch(ferry_consumer_t* consumer, int64_t epoch, int64_t first_batch) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (consumer == nullptr) return NullArgument(fn, "consumer");
    return Report(consumer->consumer->StartEpoch(epoch, first_batch));
  });
}

int ferry_consumer_resume_epoch(ferry_consumer_t* consumer, int64_t epoch,
                                const ferry_range_t* consumed, size_t num_consumed,
                                int64_t first_batch, int64_t* batches) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (consumer == nullptr) return NullArgument(fn, "consumer");
    if (consumed == nullptr && num_consumed > 0) return NullArgument(fn, "consumed");
    std::vector<ferry::EpochRange> ranges;
    ranges.reserve(num_consumed);
    for (size_t i = 0; i < num_consumed; ++i)
      ranges.push_back({consumed[i].begin, consumed[i].end});
    auto resumed = consumer->consumer->ResumeEpoch(epoch, ranges, first_batch);
    if (!resumed.ok()) return Fail(resumed.status());
    if (batches != nullptr) *batches = *resumed;
    return FERRY_OK;
  });
}

int ferry_consumer_epoch_batches(const ferry_consumer_t* consumer, int64_t* out) {
  if (consumer == nullptr) return NullArgument(__func__, "consumer");
  if (out == nullptr) return NullArgument(__func__, "out");
  *out = consumer->consumer->epoch_batches();
  return FERRY_OK;
}

int ferry_job_epoch_info(const ferry_consumer_t* consumer, ferry_epoch_info_t* out) {
  if (consumer == nullptr) return NullArgument(__func__, "consumer");
  if (out == nullptr) return NullArgument(__func__, "out");
  if (out->struct_size < sizeof(ferry_epoch_info_t)) {
    return Fail(absl::InvalidArgumentError(
        "ferry_job_epoch_info: out->struct_size must be sizeof(ferry_epoch_info_t)"));
  }
  const ferry::EpochProgress p = ferry::EpochProgress::Of(consumer->consumer->job());
  out->positions = p.positions;
  out->world_size = p.world_size;
  out->batch_size = p.batch_size;
  out->drop_last = p.drop_last ? 1 : 0;
  out->contiguous_ranks = p.contiguous_ranks ? 1 : 0;
  out->consumed = nullptr;
  out->num_consumed = 0;
  return FERRY_OK;
}

int ferry_epoch_consumed(const ferry_epoch_info_t* info, int64_t batches_done, ferry_range_t* out,
                         size_t capacity, size_t* count) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (info == nullptr) return NullArgument(fn, "info");
    if (count == nullptr) return NullArgument(fn, "count");
    if (out == nullptr && capacity > 0) return NullArgument(fn, "out");
    if (info->consumed == nullptr && info->num_consumed > 0) return NullArgument(fn, "consumed");
    if (info->struct_size < sizeof(ferry_epoch_info_t)) {
      return Fail(absl::InvalidArgumentError(
          "ferry_epoch_consumed: info->struct_size must be sizeof(ferry_epoch_info_t)"));
    }
    const ferry::EpochProgress p = ProgressFrom(*info);
    auto consumed = p.ConsumedAfter(batches_done);
    if (!consumed.ok()) return Fail(consumed.status());
    *count = consumed->size();
    if (consumed->size() > capacity) {
      return Fail(absl::ResourceExhaustedError(absl::StrCat(
          "ferry_epoch_consumed: ", consumed->size(), " ranges do not fit in ", capacity)));
    }
    for (size_t i = 0; i < consumed->size(); ++i)
      out[i] = {(*consumed)[i].begin, (*consumed)[i].end};
    return FERRY_OK;
  });
}

int ferry_consumer_position(const ferry_consumer_t* consumer, ferry_resume_point_t* out) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (consumer == nullptr) return NullArgument(fn, "consumer");
    if (out == nullptr) return NullArgument(fn, "out");
    if (out->struct_size < sizeof(ferry_resume_point_t)) {
      return Fail(absl::InvalidArgumentError(
          "ferry_consumer_position: out->struct_size must be sizeof(ferry_resume_point_t)"));
    }
    auto point = consumer->consumer->Position();
    if (!point.ok()) return Fail(point.status());
    out->epoch = point->epoch;
    out->positions = point->positions;
    out->world_size = point->world_size;
    out->batch_size = point->batch_size;
    out->drop_last = point->drop_last ? 1 : 0;
    out->batches_done = point->batches_done;
    const int consumed = RangesTo(fn, "consumed", point->consumed, out->consumed,
                                  out->consumed_capacity, &out->num_consumed);
    const int resumed = RangesTo(fn, "resumed_from", point->resumed_from, out->resumed_from,
                                 out->resumed_from_capacity, &out->num_resumed_from);
    return consumed != FERRY_OK ? consumed : resumed;
  });
}

int ferry_resume_plan(const ferry_resume_point_t* point, const ferry_epoch_info_t* run,
                      int64_t* epoch, int64_t* first_batch, ferry_range_t* dealt_after,
                      size_t capacity, size_t* count) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    ferry::ResumePoint from;
    if (const int checked = PointFrom(fn, point, &from); checked != FERRY_OK) return checked;
    if (run == nullptr) return NullArgument(fn, "run");
    if (epoch == nullptr) return NullArgument(fn, "epoch");
    if (first_batch == nullptr) return NullArgument(fn, "first_batch");
    if (count == nullptr) return NullArgument(fn, "count");
    if (run->struct_size < sizeof(ferry_epoch_info_t)) {
      return Fail(absl::InvalidArgumentError(
          "ferry_resume_plan: run->struct_size must be sizeof(ferry_epoch_info_t)"));
    }
    if (run->consumed == nullptr && run->num_consumed > 0) return NullArgument(fn, "consumed");
    auto plan = ferry::PlanResume(from, ProgressFrom(*run));
    if (!plan.ok()) return Fail(plan.status());
    *epoch = plan->epoch;
    *first_batch = plan->first_batch;
    return RangesTo(fn, "dealt_after", plan->dealt_after, dealt_after, capacity, count);
  });
}

int ferry_consumer_resume(ferry_consumer_t* consumer, const ferry_resume_point_t* point,
                          int64_t* epoch, int64_t* first_batch) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (consumer == nullptr) return NullArgument(fn, "consumer");
    ferry::ResumePoint from;
    if (const int checked = PointFrom(fn, point, &from); checked != FERRY_OK) return checked;
    auto plan = consumer->consumer->Resume(from);
    if (!plan.ok()) return Fail(plan.status());
    if (epoch != nullptr) *epoch = plan->epoch;
    if (first_batch != nullptr) *first_batch = plan->first_batch;
    return FERRY_OK;
  });
}

int ferry_consumer_next(ferry_consumer_t* consumer, int64_t timeout_ms, ferry_batch_t** out) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (consumer == nullptr) return NullArgument(fn, "consumer");
    if (out == nullptr) return NullArgument(fn, "out");
    *out = nullptr;
    auto next = consumer->consumer->Next(timeout_ms < 0 ? absl::InfiniteDuration()
                                                        : absl::Milliseconds(timeout_ms));
    if (!next.ok()) return Fail(next.status());
    if (next->has_value()) *out = new ferry_batch{std::move(**next)};
    return FERRY_OK;
  });
}

int ferry_batch_info(const ferry_batch_t* batch, ferry_batch_info_t* out) {
  if (batch == nullptr) return NullArgument(__func__, "batch");
  if (out == nullptr) return NullArgument(__func__, "out");
  out->epoch = batch->batch.epoch();
  out->index = batch->batch.index();
  out->seq = batch->batch.seq();
  out->slot = batch->batch.slot();
  out->num_samples = batch->batch.num_samples();
  out->num_fields = static_cast<uint32_t>(batch->batch.fields().size());
  return FERRY_OK;
}

int ferry_batch_field_sized(const ferry_batch_t* batch, uint32_t i, ferry_field_t* out,
                            size_t out_size) {
  if (batch == nullptr) return NullArgument(__func__, "batch");
  if (out == nullptr) return NullArgument(__func__, "out");
  if (out_size < kFieldV10Size) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("ferry_batch_field_sized: out_size ", out_size, " is smaller than ABI 1.0's ",
                     "ferry_field_t (", kFieldV10Size, " bytes); pass sizeof(ferry_field_t)")));
  }
  const auto& fields = batch->batch.fields();
  if (i >= fields.size()) {
    return Fail(absl::OutOfRangeError(
        absl::StrCat("field ", i, " requested; the batch has ", fields.size())));
  }
  const ferry::BatchField& f = fields[i];
  out->name = f.name.c_str();
  out->dtype = static_cast<int>(f.dtype);
  out->ndim = static_cast<int>(f.shape.size());
  out->shape = f.shape.data();
  out->data = f.data;
  out->nbytes = f.bytes;
  if (out_size >= offsetof(ferry_field_t, device) + sizeof(out->device)) {
    out->device = f.device;
  }
  return FERRY_OK;
}

// The ABI 1.0 symbol (the header's macro of the same name calls the sized variant).
int(ferry_batch_field)(const ferry_batch_t* batch, uint32_t i, ferry_field_t* out) {
  return ferry_batch_field_sized(batch, i, out, kFieldV10Size);
}

int ferry_batch_wait(ferry_batch_t* batch, void* cuda_stream) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (batch == nullptr) return NullArgument(fn, "batch");
    return Report(batch->batch.WaitOn(cuda_stream));
  });
}

int ferry_batch_release_on(ferry_batch_t* batch, void* cuda_stream) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (batch == nullptr) return NullArgument(fn, "batch");
    return Report(batch->batch.ReleaseOn(cuda_stream));
  });
}

int ferry_batch_device(const ferry_batch_t* batch, int* out) {
  if (batch == nullptr) return NullArgument(__func__, "batch");
  if (out == nullptr) return NullArgument(__func__, "out");
  *out = batch->batch.device();
  return FERRY_OK;
}

int ferry_cuda_pci_bus_id(int ordinal, char** out) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (out == nullptr) return NullArgument(fn, "out");
    *out = nullptr;
    absl::StatusOr<std::string> id = ferry::CudaPciBusId(ordinal);
    if (!id.ok()) return Fail(id.status());
    *out = CopyString(*id);
    return FERRY_OK;
  });
}

int ferry_batch_release(ferry_batch_t* batch) {
  const char* fn = __func__;
  return Guard(fn, [&]() -> int {
    if (batch == nullptr) return NullArgument(fn, "batch");
    return Report(batch->batch.Release());
  });
}

void ferry_batch_free(ferry_batch_t* batch) { delete batch; }

}  // extern "C"
