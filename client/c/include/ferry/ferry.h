/* ferry's stable C ABI (libferry.so): connect to ferryd, create jobs, consume batches.
 *
 * Conventions
 *   - Every function that can fail returns an int status code: 0 (FERRY_OK) on success,
 *     otherwise an absl/gRPC canonical code (FERRY_NOT_FOUND, FERRY_UNAVAILABLE, ...). The
 *     message of the last failure on the calling thread is ferry_last_error().
 *   - Handles are opaque. Each has one function that frees it; passing NULL there is a
 *     no-op.
 *   - Strings returned through char** are NUL-terminated, malloc-compatible, and owned by
 *     the caller: free them with ferry_free().
 *   - JSON is the proto3 JSON mapping of the ferry.v1 messages (proto/ferry/v1/ferry.proto)
 *     with proto field names; 64-bit integers are JSON strings, enums their names.
 *
 * Thread safety: a client may be used from several threads at once; a consumer from one
 * thread at a time; batches of one consumer may be released from any thread.
 *
 *   ferry_client_t* client;
 *   if (ferry_client_connect(NULL, &client) != FERRY_OK) die(ferry_last_error());
 *   char* job;  // JSON of ferry.v1.Job; the id is in "id"
 *   ferry_client_create_job(client, "", "{\"dataset\":{\"image_folder\":{\"root\":\"/d\"}},"
 *       "\"transform\":{\"center_crop\":{\"size\":224}},\"batch_size\":64}", &job);
 *   ferry_consumer_t* consumer;
 *   ferry_client_attach(client, job_id, 0, &consumer);
 *   ferry_consumer_start_epoch(consumer, 0, 0);
 *   ferry_batch_t* batch;
 *   while (ferry_consumer_next(consumer, -1, &batch) == FERRY_OK && batch != NULL) {
 *     ferry_field_t image;
 *     ferry_batch_field(batch, 0, &image);   // image.data, image.shape[0..ndim)
 *     ferry_batch_free(batch);               // gives the slot back
 *   }
 */
#ifndef FERRY_CLIENT_C_INCLUDE_FERRY_FERRY_H_
#define FERRY_CLIENT_C_INCLUDE_FERRY_FERRY_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(FERRY_C_BUILDING)
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

/* Bumped on any incompatible change of this header. Compare with ferry_abi_version() at
 * run time to detect a mismatched libferry.so. */
#define FERRY_ABI_VERSION 1
/* Bumped when functions or trailing struct members are added compatibly; compare with
 * ferry_abi_minor() (a library without that function is minor 0).
 *   1.1: the GPU transport: ferry_field_t.device, ferry_batch_field_sized,
 *        ferry_batch_wait, ferry_batch_release_on, ferry_cuda_pci_bus_id.
 *   1.2: ferry_client_quarantine.
 *   1.3: ferry_client_attach_on (a GPU rank names its GPU: jobs of device "cuda").
 *   1.4: ferry_job_limit, ferry_last_error_reason.
 *   1.5: resuming on another world size: ferry_consumer_resume_epoch,
 *        ferry_consumer_epoch_batches, ferry_epoch_consumed, ferry_job_epoch_info.
 *   1.6: FERRY_DTYPE_BOOL (fields of megatron_gpt jobs).
 *   1.7: ferry_client_set_held_rank_wait.
 *   1.8: taking a job back on a restarted ferryd: ferry_client_set_reattach,
 *        ferry_consumer_attaches.
 *   1.9: resume points: ferry_resume_point_t, ferry_consumer_position,
 *        ferry_consumer_resume, ferry_resume_plan. */
#define FERRY_ABI_MINOR 9

/* Status codes (absl::StatusCode / grpc::StatusCode values). */
enum {
  FERRY_OK = 0,
  FERRY_CANCELLED = 1,
  FERRY_UNKNOWN = 2,
  FERRY_INVALID_ARGUMENT = 3,
  FERRY_DEADLINE_EXCEEDED = 4,
  FERRY_NOT_FOUND = 5,
  FERRY_ALREADY_EXISTS = 6,
  FERRY_PERMISSION_DENIED = 7,
  FERRY_RESOURCE_EXHAUSTED = 8,
  FERRY_FAILED_PRECONDITION = 9,
  FERRY_ABORTED = 10,
  FERRY_OUT_OF_RANGE = 11,
  FERRY_UNIMPLEMENTED = 12,
  FERRY_INTERNAL = 13,
  FERRY_UNAVAILABLE = 14,
  FERRY_DATA_LOSS = 15,
  FERRY_UNAUTHENTICATED = 16
};

/* Element types (ferry.v1.DType values). */
enum {
  FERRY_DTYPE_UNSPECIFIED = 0,
  FERRY_DTYPE_UINT8 = 1,
  FERRY_DTYPE_UINT16 = 2,
  FERRY_DTYPE_UINT32 = 3,
  FERRY_DTYPE_INT32 = 4,
  FERRY_DTYPE_INT64 = 5,
  FERRY_DTYPE_FLOAT16 = 6,
  FERRY_DTYPE_BFLOAT16 = 7,
  FERRY_DTYPE_FLOAT32 = 8,
  FERRY_DTYPE_BOOL = 9 /* one byte, 0 or 1; since 1.6 */
};

typedef struct ferry_client ferry_client_t;
typedef struct ferry_consumer ferry_consumer_t;
typedef struct ferry_batch ferry_batch_t;

/* One field of a batch: a C-ordered array of shape[0..ndim) (shape[0] = samples in the
 * batch). Pointers stay valid until the batch is freed; `data` is read-only and its
 * contents only until the batch is released. */
typedef struct ferry_field {
  const char* name;
  int dtype; /* FERRY_DTYPE_* */
  int ndim;
  const int64_t* shape;
  const void* data; /* host memory, or device memory when device >= 0 */
  size_t nbytes;
  /* ABI 1.1. -1: `data` is host memory (host transport). Otherwise the CUDA device (this
   * process's ordinal) whose memory `data` points to (GPU transport: see ferry_batch_wait). */
  int device;
} ferry_field_t;

typedef struct ferry_batch_info {
  int64_t epoch;
  int64_t index; /* batch number within the epoch */
  int64_t seq;   /* position in the consumer's stream */
  uint32_t slot;
  uint32_t num_samples;
  uint32_t num_fields;
} ferry_batch_info_t;

/* FERRY_ABI_VERSION of the loaded library. */
FERRY_API int ferry_abi_version(void);
/* Version of the library ("0.1.0"). Static storage. */
FERRY_API const char* ferry_version(void);
/* Message of the last failed call on this thread ("" if none). Valid until the next
 * ferry_* call on this thread. */
FERRY_API const char* ferry_last_error(void);
/* Machine-readable reason of the last failed call on this thread, for the failures a
 * client acts on, else "" (ABI 1.4). Valid as ferry_last_error's message is.
 *   "RANK_HELD": FAILED_PRECONDITION from attach, the rank is consumed by a live process;
 *                the same process takes it over once its earlier consumer has ended.
 *   "NO_BATCH_YET": DEADLINE_EXCEEDED from ferry_consumer_next, nothing arrived within
 *                timeout_ms; nothing is lost, call it again. */
FERRY_API const char* ferry_last_error_reason(void);
/* "OK", "NOT_FOUND", ... for a status code; "UNKNOWN" for anything else. Static storage. */
FERRY_API const char* ferry_status_name(int code);
/* "uint8", "int64", ...; "unspecified" for anything else. Static storage. */
FERRY_API const char* ferry_dtype_name(int dtype);
/* Bytes per element of a FERRY_DTYPE_*; 0 if unknown. */
FERRY_API size_t ferry_dtype_size(int dtype);
/* Frees a string returned by this library. NULL is a no-op. */
FERRY_API void ferry_free(void* p);
/* The default gRPC socket path (see common/session_protocol.h); free with ferry_free. */
FERRY_API int ferry_default_address(char** out);

/* Connects to ferryd at `address` (socket path, optionally "unix:"-prefixed; NULL or ""
 * = the default socket). NOT_FOUND / UNAVAILABLE when no ferryd answers there. */
FERRY_API int ferry_client_connect(const char* address, ferry_client_t** out);
FERRY_API void ferry_client_free(ferry_client_t* client);
/* Pid the daemon reported when the session opened. */
FERRY_API int ferry_client_daemon_pid(const ferry_client_t* client, int* out);

/* Creates (or finds, by name + spec) a job. `name` may be NULL or "" (derived from the
 * spec). `spec_json` is a ferry.v1.JobSpec in JSON (proto or lowerCamelCase names), e.g.
 *   {"dataset":{"tokens":{"path":"/d/t.bin","token_dtype":"UINT16","seq_len":2048}},
 *    "batch_size":8,"shuffle":true,"seed":"0","world_size":1,"device":"cpu"}
 * *job_json receives the ferry.v1.Job. */
FERRY_API int ferry_client_create_job(ferry_client_t* client, const char* name,
                                      const char* spec_json, char** job_json);
/* *json receives a ferry.v1.JobStatus. */
FERRY_API int ferry_client_get_job(ferry_client_t* client, const char* job_id, char** json);
/* *json receives a ferry.v1.ListJobsResponse. */
FERRY_API int ferry_client_list_jobs(ferry_client_t* client, char** json);
FERRY_API int ferry_client_delete_job(ferry_client_t* client, const char* job_id);
/* ABI 1.2. Quarantines `count` samples of job `job_id` known to be bad (from a resume state
 * taken on an earlier ferryd; ferry.v1.QuarantineRequest says why). *added (may be NULL)
 * receives how many were not quarantined yet. */
FERRY_API int ferry_client_quarantine(ferry_client_t* client, const char* job_id,
                                      const int64_t* indices, size_t count, uint32_t* added);
/* *json receives a ferry.v1.GetStatusResponse. */
FERRY_API int ferry_client_get_status(ferry_client_t* client, char** json);

/* Attaches as `rank` of job `job_id`. Host transport (device "cpu"): the slab is mapped
 * read-only. GPU transport (device "cuda:N" or "cuda:<PCI bus id>"): the GPU is selected
 * by ferryd's PCI bus id, and every device slot and event is opened over CUDA IPC once,
 * here; FERRY_FAILED_PRECONDITION naming the CUDA error when this process cannot see that
 * GPU or IPC fails (e.g. another IPC namespace), or "this libferry was built without CUDA".
 * The consumer keeps what it needs of the client: the client may be freed first. */
FERRY_API int ferry_client_attach(ferry_client_t* client, const char* job_id, uint32_t rank,
                                  ferry_consumer_t** out);
/* The same for rank `rank` on GPU `device` ("cuda:<PCI bus id>", see ferry_cuda_pci_bus_id,
 * or "cuda:N", ferryd's ordinal): required for a job of device "cuda", whose ranks on
 * different GPUs share it; overrides the GPU of a job of device "cuda:N". NULL or "" is
 * ferry_client_attach. Since 1.3. */
FERRY_API int ferry_client_attach_on(ferry_client_t* client, const char* job_id, uint32_t rank,
                                     const char* device, ferry_consumer_t** out);
/* How long ferry_client_attach(_on) waits for a rank that another consumer holds (reason
 * "RANK_HELD") to be let go before returning that refusal, which names the holder's pid: a
 * consumer closed just before ends its stream asynchronously. 0: refused at once; negative
 * or NaN: FERRY_INVALID_ARGUMENT. Default: 5 seconds. Since 1.7. */
FERRY_API int ferry_client_set_held_rank_wait(ferry_client_t* client, double seconds);
/* Runs before each attempt to connect again to a restarted ferryd (see
 * ferry_client_set_reattach); FERRY_OK to go on, or a status code with a NUL-terminated
 * message of at most error_size bytes written to `error`, which ends that attempt. */
typedef int (*ferry_reconnect_fn)(void* ctx, char* error, size_t error_size);
/* Consumers of jobs this client created take their job back on the ferryd that answers at
 * the client's address when theirs goes away (a restart, an upgrade), trying for up to
 * `seconds`: ferry_consumer_next, _start_epoch and _resume_epoch connect again, create the
 * job again (with the samples quarantined through this client), attach as the same rank
 * and GPU and go on with the epoch after the last batch returned, losing and repeating no
 * sample. They fail with FERRY_UNAVAILABLE, saying why, once the time is spent. Job ids the
 * client returned keep naming their jobs. `before_reconnect` (may be NULL) runs before each
 * attempt with `ctx`. 0: fail at once (the default); negative or NaN:
 * FERRY_INVALID_ARGUMENT. Since 1.8. */
FERRY_API int ferry_client_set_reattach(ferry_client_t* client, double seconds,
                                        ferry_reconnect_fn before_reconnect, void* ctx);
/* Closes the stream: the daemon reclaims the consumer's slots. Batches still held stay
 * readable (memory stays mapped) until freed. */
FERRY_API void ferry_consumer_free(ferry_consumer_t* consumer);
/* Batches per epoch for this rank and slot count. */
FERRY_API int ferry_consumer_batches_per_epoch(const ferry_consumer_t* consumer, int64_t* out);
FERRY_API int ferry_consumer_num_slots(const ferry_consumer_t* consumer, uint32_t* out);
/* Requests batches [first_batch, batches_per_epoch) of `epoch` (reattaching first if the
 * previous epoch was left unfinished). */
FERRY_API int ferry_consumer_start_epoch(ferry_consumer_t* consumer, int64_t epoch,
                                         int64_t first_batch);
/* Positions [begin, end) of an epoch's order. The order is a function of the job's seed
 * and the epoch, never of the world size, so a run's progress through an epoch is the set
 * of positions it consumed (docs/data.md, "Resuming on another number of GPUs"). */
typedef struct ferry_range {
  int64_t begin;
  int64_t end;
} ferry_range_t;
/* Resuming on another world size or batch size: requests the rest of `epoch` after an
 * earlier run consumed `consumed` (num_consumed sorted disjoint ranges of the epoch's
 * positions, from ferry_epoch_consumed of that run). What is left is dealt to the job's
 * ranks as a fresh epoch is; this rank gets batches [first_batch, *batches) of it, and
 * *batches is the same for every rank (may be NULL). Every rank must pass the same ranges
 * (FAILED_PRECONDITION otherwise, and from a ferryd too old to resume). num_consumed 0:
 * ferry_consumer_start_epoch. Since 1.5. */
FERRY_API int ferry_consumer_resume_epoch(ferry_consumer_t* consumer, int64_t epoch,
                                          const ferry_range_t* consumed, size_t num_consumed,
                                          int64_t first_batch, int64_t* batches);
/* Batches per rank of the epoch last started (start_epoch or resume_epoch). Since 1.5. */
FERRY_API int ferry_consumer_epoch_batches(const ferry_consumer_t* consumer, int64_t* out);
/* How many times the consumer attached: 1 at first, one more at every reattach. Addresses
 * of slots taken from batches of an earlier attach must be taken again. Since 1.8. */
FERRY_API int ferry_consumer_attaches(const ferry_consumer_t* consumer, int64_t* out);
/* How a run's ranks are dealt an epoch: from the job (ferry_job_epoch_info) and the
 * ranges the epoch resumed after (none for a fresh epoch). */
typedef struct ferry_epoch_info {
  size_t struct_size; /* sizeof(ferry_epoch_info_t) */
  int64_t positions;  /* the epoch's positions: the job's samples_per_epoch */
  int64_t world_size;
  int64_t batch_size;
  int drop_last;
  int contiguous_ranks; /* each rank reads a contiguous run of the order (WebDataset) */
  const ferry_range_t* consumed;
  size_t num_consumed;
} ferry_epoch_info_t;
/* The job's figures for ferry_epoch_consumed, `consumed` left empty. Since 1.5. */
FERRY_API int ferry_job_epoch_info(const ferry_consumer_t* consumer, ferry_epoch_info_t* out);
/* The positions the run has consumed once every rank took its first `batches_done` batches:
 * info->consumed plus what the ranks were dealt, merged into *count ranges written to
 * out[0..capacity). At most info->num_consumed + info->world_size + 1 ranges; with a
 * smaller capacity returns FERRY_RESOURCE_EXHAUSTED and sets *count to the number needed.
 * INVALID_ARGUMENT when a field is out of range or the ranges are not sorted, disjoint and
 * inside the epoch. Needs no daemon. Since 1.5. */
FERRY_API int ferry_epoch_consumed(const ferry_epoch_info_t* info, int64_t batches_done,
                                   ferry_range_t* out, size_t capacity, size_t* count);
/* Where a run stands in an epoch, as a checkpoint keeps it: enough for a later run on any
 * world size and batch size to deliver the rest of the epoch exactly once (the C++
 * ferry::ResumePoint). Its two lists of ranges live in the caller's arrays: filled up to
 * their capacities by ferry_consumer_position, read (num_*) by the others. Since 1.9. */
typedef struct ferry_resume_point {
  size_t struct_size; /* sizeof(ferry_resume_point_t) */
  int64_t epoch;
  int64_t positions;       /* of the epoch's order (the job's samples_per_epoch) */
  ferry_range_t* consumed; /* the positions the run consumed, sorted and disjoint */
  size_t num_consumed;
  size_t consumed_capacity;
  /* The run's deal, which a run dealt alike goes on with at the same batch. */
  int64_t world_size;
  int64_t batch_size;
  int drop_last;
  ferry_range_t* resumed_from; /* the positions the deal left out */
  size_t num_resumed_from;
  size_t resumed_from_capacity;
  int64_t batches_done; /* each rank's batches of the deal taken */
} ferry_resume_point_t;
/* The run's position after the last batch ferry_consumer_next returned (the next epoch,
 * none consumed, after an epoch's end). When a list does not fit its capacity: its num_*
 * says how many ranges it needs and the call fails with FERRY_RESOURCE_EXHAUSTED; at most
 * world_size + 1 more than the ranges the epoch resumed from. Needs no daemon. Since 1.9. */
FERRY_API int ferry_consumer_position(const ferry_consumer_t* consumer, ferry_resume_point_t* out);
/* Where a run dealt as `run` (ferry_job_epoch_info of its job) starts from `point`: *epoch,
 * *first_batch and the positions its deal leaves out (*count ranges written to
 * dealt_after[0..capacity), FERRY_RESOURCE_EXHAUSTED and *count the number needed when they
 * do not fit), to pass to ferry_consumer_resume_epoch. A point whose epoch was consumed whole
 * starts the next; a run dealt as the point's goes on with its deal at its batch; another
 * is dealt what the point did not consume. FERRY_FAILED_PRECONDITION when the epochs have
 * different numbers of positions (the dataset changed); FERRY_INVALID_ARGUMENT naming a
 * field out of range. Needs no daemon. Since 1.9. */
FERRY_API int ferry_resume_plan(const ferry_resume_point_t* point, const ferry_epoch_info_t* run,
                                int64_t* epoch, int64_t* first_batch, ferry_range_t* dealt_after,
                                size_t capacity, size_t* count);
/* Starts where `point` says, as ferry_resume_plan plans it for this consumer's job; *epoch
 * and *first_batch (either may be NULL) say where. Since 1.9. */
FERRY_API int ferry_consumer_resume(ferry_consumer_t* consumer, const ferry_resume_point_t* point,
                                    int64_t* epoch, int64_t* first_batch);
/* Waits for the next batch: *out = a batch, or NULL at the end of the epoch. timeout_ms < 0
 * waits forever; on timeout returns FERRY_DEADLINE_EXCEEDED and nothing is lost. */
FERRY_API int ferry_consumer_next(ferry_consumer_t* consumer, int64_t timeout_ms,
                                  ferry_batch_t** out);

FERRY_API int ferry_batch_info(const ferry_batch_t* batch, ferry_batch_info_t* out);
/* ABI 1.1: field `i` (0 <= i < num_fields; OUT_OF_RANGE otherwise), written to `out` up to
 * `out_size` bytes (pass sizeof(ferry_field_t)): members past out_size are not touched, so
 * callers built against an older header stay safe. */
FERRY_API int ferry_batch_field_sized(const ferry_batch_t* batch, uint32_t i, ferry_field_t* out,
                                      size_t out_size);
/* ABI 1.0 entry point: fills the members up to `nbytes` only. Kept for binaries built
 * against ABI 1.0; code compiled with this header calls ferry_batch_field_sized through
 * the macro below, which also fills `device`. */
FERRY_API int ferry_batch_field(const ferry_batch_t* batch, uint32_t i, ferry_field_t* out);
#define ferry_batch_field(batch, i, out) \
  ferry_batch_field_sized((batch), (i), (out), sizeof(*(out)))
/* Gives the slot back; idempotent. The field pointers stay valid, but the daemon may now
 * overwrite the data. GPU batches: the same as ferry_batch_release_on(batch, the stream last
 * passed to ferry_batch_wait), or on the legacy default stream when it was never called. */
FERRY_API int ferry_batch_release(ferry_batch_t* batch);

/* GPU transport (ABI 1.1). `cuda_stream` is a cudaStream_t of the batch's device; NULL
 * (0) is that device's legacy default stream. Neither call blocks the host.
 *
 * Lifetime contract for a batch whose fields have device >= 0:
 *   1. ferry_batch_wait(batch, s) before enqueueing on `s` any work that reads the fields
 *      (or on a stream ordered after `s`): it makes `s` wait, on the GPU, for ferryd's copy
 *      into the slot (cudaStreamWaitEvent on the slot's ready event).
 *   2. ferry_batch_release_on(batch, s) after the last such work is enqueued on `s`: it
 *      records the slot's released event on `s` and gives the slot back; ferryd writes
 *      the slot again only after that event has completed, so it cannot overwrite data
 *      still being read. Work on other streams must be ordered before it by the caller.
 *   3. The device memory stays mapped until the batch is freed; its contents may change
 *      any time after the release. ferry_batch_free releases as ferry_batch_release does.
 * A failed CUDA call returns its error (named) and leaves the slot leased: it is given
 * back when the consumer's stream ends. For host batches ferry_batch_wait does nothing and
 * ferry_batch_release_on is ferry_batch_release. */
FERRY_API int ferry_batch_wait(ferry_batch_t* batch, void* cuda_stream);
FERRY_API int ferry_batch_release_on(ferry_batch_t* batch, void* cuda_stream);
/* CUDA device the batch's fields live on (this process's ordinal), or -1 for host memory. */
FERRY_API int ferry_batch_device(const ferry_batch_t* batch, int* out);

/* PCI bus id ("0000:3b:00.0", lower case) of this process's CUDA device `ordinal`: send
 * device "cuda:<bus id>" in a job spec to name the same GPU to ferryd whatever
 * CUDA_VISIBLE_DEVICES says. INVALID_ARGUMENT for an ordinal this process does not have;
 * FAILED_PRECONDITION without a usable GPU or driver, or when built without CUDA. Free
 * *out with ferry_free. */
FERRY_API int ferry_cuda_pci_bus_id(int ordinal, char** out);
/* FERRY_ABI_MINOR of the loaded library. */
FERRY_API int ferry_abi_minor(void);

/* The bounds ferryd puts on a job spec, so that a client refuses what ferryd would, with the
 * same numbers: a FERRY_LIMIT_* value, or 0 for a limit this library does not know. */
enum {
  FERRY_LIMIT_BATCH_SIZE = 1,     /* JobSpec.batch_size is in [1, this] */
  FERRY_LIMIT_WORLD_SIZE = 2,     /* JobSpec.world_size is at most this */
  FERRY_LIMIT_PREFETCH_DEPTH = 3, /* JobSpec.prefetch_depth is at most this */
  FERRY_LIMIT_JOB_NAME_BYTES = 4  /* a job name is at most this many printable ASCII bytes */
};
FERRY_API uint64_t ferry_job_limit(int limit);
/* Releases (if not yet) and frees the batch. */
FERRY_API void ferry_batch_free(ferry_batch_t* batch);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FERRY_CLIENT_C_INCLUDE_FERRY_FERRY_H_ */
