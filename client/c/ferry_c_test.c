/* Tests of the C ABI that need no ferryd: versioning, names, argument checks, the
 * per-thread last error, and the error for a missing daemon. Written in C on purpose. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferry/ferry.h"

static int failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

static void* OtherThread(void* arg) {
  (void)arg;
  /* A fresh thread starts with no error, whatever happened elsewhere. */
  CHECK(strcmp(ferry_last_error(), "") == 0);
  return NULL;
}

int main(void) {
  CHECK(ferry_abi_version() == FERRY_ABI_VERSION);
  CHECK(ferry_abi_minor() == FERRY_ABI_MINOR);

  /* ABI 1.4: ferryd's bounds on a job spec. */
  CHECK(ferry_job_limit(FERRY_LIMIT_BATCH_SIZE) == 1048576);
  CHECK(ferry_job_limit(FERRY_LIMIT_WORLD_SIZE) == 1048576);
  CHECK(ferry_job_limit(FERRY_LIMIT_PREFETCH_DEPTH) == 64);
  CHECK(ferry_job_limit(FERRY_LIMIT_JOB_NAME_BYTES) == 128);
  CHECK(ferry_job_limit(0) == 0);
  CHECK(strcmp(ferry_last_error_reason(), "") == 0);

  /* ABI 1.5: the positions a run consumed, on any world size, with no daemon. 4 ranks of
   * batch 2 after 2 batches of a 30-position epoch: [0, 16). Resumed from there on 3 ranks
   * of batch 3 with drop_last, after 1 batch: [0, 25). */
  {
    ferry_epoch_info_t info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    info.positions = 30;
    info.world_size = 4;
    info.batch_size = 2;
    ferry_range_t out[8];
    size_t count = 0;
    CHECK(ferry_epoch_consumed(&info, 2, out, 8, &count) == FERRY_OK);
    CHECK(count == 1 && out[0].begin == 0 && out[0].end == 16);
    ferry_range_t done = {0, 16};
    info.consumed = &done;
    info.num_consumed = 1;
    info.world_size = 3;
    info.batch_size = 3;
    info.drop_last = 1;
    CHECK(ferry_epoch_consumed(&info, 1, out, 8, &count) == FERRY_OK);
    CHECK(count == 1 && out[0].begin == 0 && out[0].end == 25);
    /* WebDataset ranks read contiguous runs: 3 ranks of 10, one batch of 2 each. */
    info.consumed = NULL;
    info.num_consumed = 0;
    info.batch_size = 2;
    info.drop_last = 0;
    info.contiguous_ranks = 1;
    CHECK(ferry_epoch_consumed(&info, 1, out, 2, &count) == FERRY_RESOURCE_EXHAUSTED);
    CHECK(count == 3);
    CHECK(ferry_epoch_consumed(&info, 1, out, 8, &count) == FERRY_OK);
    CHECK(count == 3 && out[1].begin == 10 && out[1].end == 12 && out[2].begin == 20);
    ferry_range_t bad[2] = {{5, 9}, {2, 4}};
    info.consumed = bad;
    info.num_consumed = 2;
    CHECK(ferry_epoch_consumed(&info, 1, out, 8, &count) == FERRY_INVALID_ARGUMENT);
    CHECK(strstr(ferry_last_error(), "sorted, disjoint") != NULL);
    CHECK(ferry_consumer_resume_epoch(NULL, 0, NULL, 0, 0, NULL) == FERRY_INVALID_ARGUMENT);
  }

  /* ABI 1.1: GPU entry points check their arguments without a device. */
  CHECK(ferry_batch_wait(NULL, NULL) == FERRY_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "'batch'") != NULL);
  CHECK(ferry_batch_release_on(NULL, NULL) == FERRY_INVALID_ARGUMENT);
  CHECK(ferry_cuda_pci_bus_id(0, NULL) == FERRY_INVALID_ARGUMENT);
  {
    /* With a GPU: its bus id. Without one (or a build without CUDA): FAILED_PRECONDITION
     * with the reason. */
    char* bus_id = NULL;
    int code = ferry_cuda_pci_bus_id(0, &bus_id);
    if (code == FERRY_OK) {
      CHECK(bus_id != NULL && strlen(bus_id) == 12);
      ferry_free(bus_id);
    } else {
      CHECK(code == FERRY_FAILED_PRECONDITION);
      CHECK(bus_id == NULL);
      CHECK(strstr(ferry_last_error(), "cudaGetDeviceCount") != NULL ||
            strstr(ferry_last_error(), "built without CUDA") != NULL);
    }
    CHECK(ferry_cuda_pci_bus_id(-1, &bus_id) != FERRY_OK);
  }
  CHECK(strlen(ferry_version()) > 0);
  CHECK(strcmp(ferry_status_name(FERRY_OK), "OK") == 0);
  CHECK(strcmp(ferry_status_name(FERRY_NOT_FOUND), "NOT_FOUND") == 0);
  CHECK(strcmp(ferry_status_name(FERRY_UNAUTHENTICATED), "UNAUTHENTICATED") == 0);
  CHECK(strcmp(ferry_status_name(99), "UNKNOWN") == 0);
  CHECK(strcmp(ferry_dtype_name(FERRY_DTYPE_BFLOAT16), "bfloat16") == 0);
  CHECK(ferry_dtype_size(FERRY_DTYPE_INT64) == 8);
  CHECK(ferry_dtype_size(42) == 0);

  char* address = NULL;
  CHECK(ferry_default_address(&address) == FERRY_OK);
  CHECK(address != NULL && strstr(address, "ferryd.sock") != NULL);
  ferry_free(address);

  char dir_template[] = "/tmp/ferry_c_test_XXXXXX";
  char* dir = mkdtemp(dir_template);
  CHECK(dir != NULL);
  char missing[256];
  snprintf(missing, sizeof(missing), "%s/ferryd.sock", dir);
  ferry_client_t* client = (ferry_client_t*)0x1;
  int code = ferry_client_connect(missing, &client);
  CHECK(code == FERRY_NOT_FOUND);
  CHECK(client == NULL);
  CHECK(strstr(ferry_last_error(), "no ferryd at ") != NULL);
  CHECK(strstr(ferry_last_error(), missing) != NULL);
  CHECK(strstr(ferry_last_error(), "systemctl start ferryd") != NULL);

  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, OtherThread, NULL) == 0);
  pthread_join(thread, NULL);
  CHECK(strstr(ferry_last_error(), "no ferryd at ") != NULL); /* still ours */

  CHECK(ferry_client_connect(missing, NULL) == FERRY_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "'out'") != NULL);
  char* json = NULL;
  CHECK(ferry_client_get_status(NULL, &json) == FERRY_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "ferry_client_get_status") != NULL);
  CHECK(ferry_consumer_next(NULL, 0, NULL) == FERRY_INVALID_ARGUMENT);
  /* ABI 1.7 */
  CHECK(ferry_client_set_held_rank_wait(NULL, 1.0) == FERRY_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "'client'") != NULL);
  /* ABI 1.8 */
  CHECK(ferry_client_set_reattach(NULL, 1.0, NULL, NULL) == FERRY_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "'client'") != NULL);
  CHECK(ferry_consumer_attaches(NULL, NULL) == FERRY_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "'consumer'") != NULL);
  /* ABI 1.9: a plan needs no daemon. 2 ranks x 4 over 100 positions, 3 batches each taken. */
  {
    ferry_range_t consumed[1] = {{0, 24}};
    ferry_resume_point_t point;
    memset(&point, 0, sizeof point);
    point.struct_size = sizeof point;
    point.epoch = 5;
    point.positions = 100;
    point.consumed = consumed;
    point.num_consumed = 1;
    point.world_size = 2;
    point.batch_size = 4;
    point.batches_done = 3;
    ferry_epoch_info_t run;
    memset(&run, 0, sizeof run);
    run.struct_size = sizeof run;
    run.positions = 100;
    run.world_size = 3;
    run.batch_size = 4;
    int64_t epoch = -1, first = -1;
    ferry_range_t after[2];
    size_t count = 0;
    CHECK(ferry_resume_plan(&point, &run, &epoch, &first, after, 2, &count) == FERRY_OK);
    CHECK(epoch == 5 && first == 0 && count == 1 && after[0].begin == 0 && after[0].end == 24);
    run.world_size = 2; /* dealt alike: the same deal, at its batch */
    CHECK(ferry_resume_plan(&point, &run, &epoch, &first, after, 2, &count) == FERRY_OK);
    CHECK(epoch == 5 && first == 3 && count == 0);
    run.positions = 99;
    CHECK(ferry_resume_plan(&point, &run, &epoch, &first, after, 2, &count) ==
          FERRY_FAILED_PRECONDITION);
    CHECK(strstr(ferry_last_error(), "dataset changed") != NULL);
    CHECK(ferry_resume_plan(NULL, &run, &epoch, &first, after, 2, &count) ==
          FERRY_INVALID_ARGUMENT);
    CHECK(ferry_consumer_position(NULL, &point) == FERRY_INVALID_ARGUMENT);
    CHECK(ferry_consumer_resume(NULL, &point, NULL, NULL) == FERRY_INVALID_ARGUMENT);
  }
  ferry_client_free(NULL);
  ferry_consumer_free(NULL);
  ferry_batch_free(NULL);
  ferry_free(NULL);
  rmdir(dir);

  if (failures == 0) printf("ferry_c_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
