"""Trainers of a GPU job killed with SIGKILL over and over, each while it holds a batch in
device memory ferryd exported to it (label gpu; skipped without a GPU):

  FERRY_GPU_KILL_CYCLES kills (default 200), FERRY_GPU_KILL_RANKS trainers at a time
  (default 4, the ranks of one job on GPU 0), for a tokens job and for a JPEG job that the
  GPU decodes and normalizes: after each round ferryd frees every rank, and at the end the
  GPU memory ferryd's process holds (nvidia-smi) is within 2 MiB of what it held after the
  first round, as is the device memory ferryd counts against its budget. ferryd lives
  throughout and its log holds no CUDA error.

The trainers use the client library without PyTorch (attach, one batch, then wait to be
killed), so a cycle costs little more than a CUDA context.
"""

import os
import signal
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))

import ferry_it  # noqa: E402
import gpu_skip  # noqa: E402

CYCLES = int(os.environ.get("FERRY_GPU_KILL_CYCLES", "200"))
RANKS = int(os.environ.get("FERRY_GPU_KILL_RANKS", "4"))

TRAINER = r"""
import sys, time
from ferry import _lib
from ferry.client import Client
address, job_id, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = Client(address)
consumer = client.attach(job_id, rank, "cuda:" + _lib.cuda_pci_bus_id(0))
consumer.start_epoch(0)
batch = consumer.next(60000)
assert batch is not None
print("holding", flush=True)
time.sleep(600)
"""


SKIP = gpu_skip.announce(gpu_skip.skip_reason())


def process_gpu_mib(pid):
    """The GPU memory nvidia-smi reports for process `pid`, in MiB (0 when it holds none)."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid):
            return int(fields[1])
    return 0


@unittest.skipIf(SKIP is not None, SKIP or "")
class GpuKillLoopTest(unittest.TestCase):
    def test_tokens_job(self):
        import ferry
        import numpy as np
        with ferry_it.FerryDaemon() as daemon:
            path = os.path.join(daemon.dir, "tokens.bin")
            (np.arange(1 << 22) % 50000).astype(np.uint16).tofile(path)
            self.kill_loop(daemon, ferry.Tokens(path, seq_len=2047, dtype="uint16"), 16)

    def test_jpeg_job_decoded_and_normalized_on_the_gpu(self):
        # Each attach also makes the stage's nvJPEG decoder, its streams and arenas.
        import ferry
        with ferry_it.FerryDaemon(config='gpu_decode: "gpu"\n') as daemon:
            root = ferry_it.make_image_folder(os.path.join(daemon.dir, "images"),
                                              {"a": 40, "b": 40})
            self.kill_loop(daemon, ferry.ImageFolder(root), 8,
                           transform=ferry.RandomResizedCrop(32),
                           image_output={"dtype": "BFLOAT16"})

    def kill_loop(self, daemon, dataset, batch_size, transform=None, image_output=None):
        from ferry.client import Client
        from ferry._spec import _job_spec
        client = Client(daemon.address)
        self.addCleanup(client.close)
        spec = _job_spec(dataset, batch_size, transform, True, 1, False, RANKS, 2, image_output,
                         device="cuda")
        job = client.create_job(spec, name="kill-loop")

        def ranks():
            return [r for j in client.status().get("jobs", []) if j["job"]["id"] == job["id"]
                    for r in j.get("ranks", [])]

        def ferryd_device_bytes():
            gpus = client.status().get("daemon", {}).get("gpus", [])
            return sum(int(g.get("device_memory_in_use_bytes", 0)) for g in gpus)

        def one_round(round_index):
            procs = [subprocess.Popen([sys.executable, "-c", TRAINER, daemon.address,
                                       job["id"], str(rank)], stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      env=ferry_it.worker_env(), text=True)
                     for rank in range(RANKS)]
            for p in procs:
                line = p.stdout.readline()
                if line.strip() != "holding":
                    for q in procs:
                        q.kill()
                    self.fail("round %d: a trainer did not get its batch: %s%s\nferryd log:\n%s"
                              % (round_index, line, p.stdout.read(), daemon.log()[-3000:]))
            for p in procs:
                p.send_signal(signal.SIGKILL)
            for p in procs:
                p.wait(30)
                p.stdout.close()
            detached = ferry_it.poll(lambda: not any(r.get("attached") for r in ranks()), 30)
            self.assertTrue(detached, "round %d: a rank still attached 30 s after its trainer "
                            "was killed" % round_index)
            self.assertIsNone(daemon.process.poll(), "ferryd died; log:\n%s" % daemon.log())

        rounds = max(1, CYCLES // RANKS)
        one_round(0)  # the first attach of each rank makes what stays (kernels, contexts)
        start_mib, start_bytes = process_gpu_mib(daemon.pid), ferryd_device_bytes()
        series = [start_mib]
        began = time.monotonic()
        for r in range(1, rounds + 1):
            one_round(r)
            if r % max(1, rounds // 8) == 0 or r == rounds:
                series.append(process_gpu_mib(daemon.pid))
        end_mib, end_bytes = process_gpu_mib(daemon.pid), ferryd_device_bytes()
        print("%s: %d kills (%d rounds of %d trainers) in %.0f s: ferryd's GPU memory %d -> %d "
              "MiB (samples %s); its budgeted device bytes %d -> %d"
              % (self.id().rsplit(".", 1)[-1], rounds * RANKS, rounds, RANKS,
                 time.monotonic() - began, start_mib, end_mib, series, start_bytes, end_bytes),
              flush=True)
        self.assertLessEqual(abs(end_mib - start_mib), 2, series)
        self.assertLessEqual(abs(end_bytes - start_bytes), 2 << 20)
        log = daemon.log()
        for marker in gpu_skip.CUDA_ERROR_MARKERS:
            self.assertNotIn(marker, log)


if __name__ == "__main__":
    unittest.main()
