// How a GPU rank reads fixed-size records: straight from the dataset's page cache (a
// "gather") or through the workers' copy. No CUDA types, so the service configures it
// without a CUDA toolkit.
#ifndef FERRY_SERVER_TRANSPORT_GATHER_OPTIONS_H_
#define FERRY_SERVER_TRANSPORT_GATHER_OPTIONS_H_

#include "absl/time/time.h"

namespace ferry {

// Reading fixed-size records straight from the dataset's page cache (DaemonConfig's
// gather_* settings and disable_page_cache_gather; CopyPath in ferry.proto). A job whose
// source has direct_rows() and needs no conversion gets it when enabled and its file fits
// the pinned budget: the file's mapping is registered read-only once (shared by every rank
// reading it, since a range can be registered only once per process), and for each batch
// the pipeline picks to gather, workers write only each row's index and a kernel of
// `thread_blocks` blocks gathers the rows.
// Batches take `streams` streams in turn, so up to that many kernels run at once. Several
// small kernels keep PCIe busier than one or two large ones (each kernel's ramp and tail
// overlap the others'), and take fewer SMs (scripts/gpu-gather-sweep.sh compares settings;
// docs/benchmarks.md has the figures).
// Unless `every_batch`, only batches made while the trainer waits for ferry are gathered
// (DeviceStage::gathers_every_batch says why). Registering the mapping reads the whole
// file in: an attach waits for it up to `registration_wait`, and past that the rank starts
// with the workers' copy and gathers once the registration is done (DeviceStage::
// gather_ready).
// The defaults here are DaemonConfig's too: ApplyDefaults (server/service/config.cc) takes
// them from GatherOptions{}.
struct GatherOptions {
  // DaemonConfig.disable_page_cache_gather, inverted. Default: true.
  bool enabled = true;
  // DaemonConfig.gather_every_batch. Default: false.
  bool every_batch = false;
  // DaemonConfig.gather_thread_blocks. Default: 16.
  int thread_blocks = 16;
  // DaemonConfig.gather_streams. Default: 4.
  int streams = 4;
  // DaemonConfig.gather_registration_wait_ms. Default: 1 second.
  absl::Duration registration_wait = absl::Seconds(1);
};

}  // namespace ferry

#endif  // FERRY_SERVER_TRANSPORT_GATHER_OPTIONS_H_
