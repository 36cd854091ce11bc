"""Several GPUs, one ferryd (label multi_gpu; skipped with fewer than 2 GPUs):

  (a) one rank per GPU, every rank's Loader started at the same instant against a fresh
      ferryd, FERRY_MULTI_GPU_ROUNDS times (default 50): ferryd never dies, every rank gets
      its batches on its own GPU, every sample of the epoch arrives exactly once across the
      ranks, ferryd drains and exits 0 on SIGTERM, and its log holds no CUDA error.
      Regression test for ferryd's SIGSEGV when trainers on different GPUs attached
      together (CUDA calls made with another device's context, or none, current).
"""

import json
import os
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))

import ferry_it  # noqa: E402

WORKER = os.path.join(HERE, "multi_gpu_worker.py")
ROUNDS = int(os.environ.get("FERRY_MULTI_GPU_ROUNDS", "50"))
CUDA_ERROR_MARKERS = ("CUDA_ERROR", "cudaError", "nvjpeg error", "NVJPEG_STATUS")


def skip_reason():
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False (no GPU visible)"
    if torch.cuda.device_count() < 2:
        return "%d GPU visible; these tests need 2 or more" % torch.cuda.device_count()
    return None


SKIP = skip_reason()
if SKIP is not None:
    print("GPU tests skipped: %s" % SKIP, flush=True)  # ctest reports the test as skipped


@unittest.skipIf(SKIP is not None, SKIP or "")
class MultiGpuTest(unittest.TestCase):
    def test_a_ranks_on_every_gpu_attach_at_the_same_instant(self):
        import torch
        gpus = torch.cuda.device_count()
        batch = 4
        work = ferry_it.short_tempdir("ferry-mgpu-")
        counts = {"a": gpus * batch * 3 // 2, "b": gpus * batch * 3 - gpus * batch * 3 // 2}
        root = ferry_it.make_image_folder(os.path.join(work, "images"), counts)
        images = sum(counts.values())
        rounds = []
        for n in range(ROUNDS):
            rounds.append({"dir": os.path.join(work, "r%d" % n)})
        procs, logs = [], []
        for rank in range(gpus):
            config = {"rank": rank, "world_size": gpus, "root": root, "batch_size": batch,
                      "rounds": [{"address": os.path.join(r["dir"], "ferryd.sock"),
                                  "go": os.path.join(work, "go%d" % n),
                                  "out": os.path.join(work, "out%d.%d.json" % (n, rank))}
                                 for n, r in enumerate(rounds)]}
            logs.append(os.path.join(work, "rank%d.log" % rank))
            with open(logs[-1], "wb") as log:
                procs.append(subprocess.Popen([sys.executable, WORKER, json.dumps(config)],
                                              stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                              env=ferry_it.worker_env()))

        def cleanup():
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        self.addCleanup(cleanup)

        crashes = []
        for n in range(ROUNDS):
            daemon = ferry_it.FerryDaemon(config="drain_timeout_seconds: 2\n")
            # The workers' round n addresses this daemon's socket.
            os.symlink(daemon.dir, os.path.join(work, "r%d" % n))
            outs = [os.path.join(work, "out%d.%d.json" % (n, rank)) for rank in range(gpus)]
            open(os.path.join(work, "go%d" % n), "w").close()
            deadline = time.monotonic() + 120
            while not all(os.path.exists(o) for o in outs):
                dead = [r for r, p in enumerate(procs) if p.poll() is not None]
                self.assertFalse(dead, "round %d: rank(s) %s exited; log:\n%s" % (
                    n, dead, ferry_it.tail(logs[dead[0]]) if dead else ""))
                if daemon.process.poll() is not None:
                    break
                self.assertLess(time.monotonic(), deadline,
                                "round %d: no result within 120 s; ferryd:\n%s"
                                % (n, daemon.log()))
                time.sleep(0.01)
            code = daemon.process.poll()
            log = open(daemon.log_path, errors="replace").read()
            if code is not None:
                crashes.append("round %d: ferryd exited with %d; log:\n%s"
                               % (n, code, log[-3000:]))
                daemon.stop()
                break
            results = [ferry_it.read_json(o) for o in outs]
            for rank, result in enumerate(results):
                self.assertNotIn("error", result, "round %d rank %d; ferryd:\n%s"
                                 % (n, rank, log[-3000:]))
                self.assertEqual(result["device"], "cuda:%d" % rank)
            seen = sorted(i for r in results for i in r["index"])
            self.assertEqual(seen, list(range(images)), "round %d: every sample once" % n)
            self.assertEqual(daemon.stop(), 0, "round %d: ferryd's exit; log:\n%s"
                             % (n, log[-3000:]))
            errors = [line for line in log.splitlines()
                      if any(m in line for m in CUDA_ERROR_MARKERS)]
            self.assertEqual(errors, [], "round %d: CUDA errors in ferryd's log" % n)
        self.assertEqual(crashes, [])
        print("%d rounds of %d ranks on %d GPUs attaching together: 0 crashes"
              % (ROUNDS, gpus, gpus), flush=True)


if __name__ == "__main__":
    unittest.main()
