"""Several GPUs, one ferryd (label multi_gpu; skipped with fewer than 2 GPUs):

  (a) one rank per GPU, every rank's Loader started at the same instant against a fresh
      ferryd, FERRY_MULTI_GPU_ROUNDS times (default 50): ferryd never dies, every rank gets
      its batches (photo-sized JPEGs, cropped to 224 and normalized to bfloat16 on its GPU,
      JPEGs decoded by the GPU's nvJPEG where ferryd has it) on its own GPU while its GPU
      computes, every sample of the epoch arrives exactly once across the ranks, ferryd
      drains and exits 0 on SIGTERM, and its log holds no CUDA error.
      FERRY_MULTI_GPU_SELF_EXIT=1 (for a ferryd run under a wrapper that does not forward
      SIGTERM, such as compute-sanitizer): ferryd is not signalled but exits by itself once
      idle (exit_when_idle_seconds: 15), and the test waits for that.
      Regression test for ferryd's SIGSEGV when trainers on different GPUs attached
      together (CUDA calls made with another device's context, or none, current). The
      ranks of a round share one job (the spec names no GPU; each rank names its own at
      attach), which status shows with a rank per GPU.
  (b) one job over every GPU, its trainers started together; the trainer on GPU 1 is
      killed with SIGKILL mid-epoch while the others train on: they finish their epoch,
      ferryd lives, and a new trainer on GPU 1 resumes from the dead one's state, so that
      every sample of the epoch arrives exactly once across the ranks.
  (c) elastic resume on GPUs: the trainers of every GPU save their state after 2 batches and
      are killed; the run resumes on GPU 0 alone with another batch size, and across the two
      runs every sample of the epoch arrives exactly once.
"""

import json
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

WORKER = os.path.join(HERE, "multi_gpu_worker.py")
GPU_WORKER = os.path.join(HERE, "gpu_worker.py")
ROUNDS = int(os.environ.get("FERRY_MULTI_GPU_ROUNDS", "50"))
SELF_EXIT = os.environ.get("FERRY_MULTI_GPU_SELF_EXIT") == "1"




SKIP = gpu_skip.announce(gpu_skip.skip_reason(min_gpus=2))


@unittest.skipIf(SKIP is not None, SKIP or "")
class MultiGpuTest(unittest.TestCase):
    def test_a_ranks_on_every_gpu_attach_at_the_same_instant(self):
        import torch
        gpus = torch.cuda.device_count()
        batch = 16
        work = ferry_it.short_tempdir("ferry-mgpu-")
        images = gpus * batch * 4  # 4 batches a rank
        root = ferry_it.make_photo_folder(os.path.join(work, "images"), per_class=images // 2)
        rounds = []
        for n in range(ROUNDS):
            rounds.append({"dir": os.path.join(work, "r%d" % n)})
        procs, logs = [], []
        for rank in range(gpus):
            config = {"rank": rank, "world_size": gpus, "root": root, "batch_size": batch,
                      "crop": 224,
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
            daemon = ferry_it.FerryDaemon(
                config="drain_timeout_seconds: 2\n" +
                ("exit_when_idle_seconds: 15\n" if SELF_EXIT else ""),
                start_timeout=120 if SELF_EXIT else 30)
            # The workers' round n addresses this daemon's socket.
            os.symlink(daemon.dir, os.path.join(work, "r%d" % n))
            outs = [os.path.join(work, "out%d.%d.json" % (n, rank)) for rank in range(gpus)]
            open(os.path.join(work, "go%d" % n), "w").close()
            deadline = time.monotonic() + 120
            while not all(os.path.exists(o) for o in outs):
                # A rank that wrote this round's result may have ended (after the last round).
                dead = [r for r, p in enumerate(procs)
                        if p.poll() is not None and not os.path.exists(outs[r])]
                self.assertFalse(dead, "round %d: rank(s) %s exited; log:\n%s" % (
                    n, dead, ferry_it.tail(logs[dead[0]]) if dead else ""))
                if daemon.process.poll() is not None:
                    break
                self.assertLess(time.monotonic(), deadline,
                                "round %d: no result within 120 s; ferryd:\n%s"
                                % (n, daemon.log()))
                time.sleep(0.01)
            results = [ferry_it.read_json(o) if os.path.exists(o) else {"error": "none"}
                       for o in outs]
            if any("error" in r for r in results):
                # A rank that lost its ferryd (UNAVAILABLE) may see it before we do.
                try:
                    daemon.process.wait(10)
                except subprocess.TimeoutExpired:
                    pass
            code = daemon.process.poll()
            with open(daemon.log_path, errors="replace") as f:
                log = f.read()
            if code is not None:
                crashes.append("round %d: ferryd exited with %d%s; ranks: %s; log:\n%s"
                               % (n, code, " (SIGSEGV)" if code == -11 else "",
                                  [r.get("error") for r in results], log[-3000:]))
                daemon.stop()
                break
            for rank, result in enumerate(results):
                self.assertNotIn("error", result, "round %d rank %d; ferryd:\n%s"
                                 % (n, rank, log[-3000:]))
                self.assertEqual(result["device"], "cuda:%d" % rank)
            seen = sorted(i for r in results for i in r["index"])
            self.assertEqual(seen, list(range(images)), "round %d: every sample once" % n)
            if n == 0:
                gpu_decode = [line for line in log.splitlines() if "JPEG decode on the GPU" in line]
                print("round 0: %d stages decode JPEGs on their GPU%s" % (
                    len(gpu_decode), (": " + gpu_decode[0]) if gpu_decode else ""), flush=True)
            # One job for the run, a rank on each GPU.
            jobs = ferry_it.ferryctl(daemon.address, "status").get("jobs", [])
            self.assertEqual(len(jobs), 1, "round %d: the ranks made %d jobs" % (n, len(jobs)))
            devices = sorted(r.get("device") for r in jobs[0].get("ranks", []))
            self.assertEqual(devices, ["cuda:%d" % r for r in range(gpus)], "round %d" % n)
            # SIGTERM; the whole log, drain included, is read before stop() removes it.
            if not SELF_EXIT:
                daemon.terminate()
            try:
                daemon.process.wait(120 if SELF_EXIT else 30)
            except subprocess.TimeoutExpired:
                pass
            with open(daemon.log_path, errors="replace") as f:
                log = f.read()
            code = daemon.stop()
            self.assertEqual(code, 0, "round %d: ferryd's exit; log:\n%s" % (n, log[-3000:]))
            errors = [line for line in log.splitlines()
                      if any(m in line for m in gpu_skip.CUDA_ERROR_MARKERS)]
            self.assertEqual(errors, [], "round %d: CUDA errors in ferryd's log" % n)
        self.assertEqual(crashes, [])
        print("%d rounds of %d ranks on %d GPUs attaching together: 0 crashes, one job each"
              % (ROUNDS, gpus, gpus), flush=True)

    def start_trainer(self, daemon, name, **config):
        """A gpu_worker.py trainer (seed 3, one epoch, crops of 64) writing <name>.json and
        <name>.log in daemon.dir: (process, out path, log path)."""
        out = os.path.join(daemon.dir, name + ".json")
        log = os.path.join(daemon.dir, name + ".log")
        base = dict(address=daemon.address, seed=3, epochs=1, crop=64, out=out)
        base.update(config)
        with open(log, "wb") as f:
            proc = subprocess.Popen([sys.executable, GPU_WORKER, json.dumps(base)],
                                    stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                                    env=ferry_it.worker_env())
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        return proc, out, log

    def test_b_kill_one_gpus_trainer_while_the_others_train(self):
        import torch
        gpus = torch.cuda.device_count()
        batch = 8
        daemon = ferry_it.FerryDaemon(config="drain_timeout_seconds: 2\n")
        self.addCleanup(daemon.stop)
        images = gpus * batch * 6  # 6 batches a rank
        root = ferry_it.make_photo_folder(os.path.join(daemon.dir, "images"), per_class=images // 2)

        def start(name, **config):
            return self.start_trainer(daemon, name, root=root, world_size=gpus,
                                      batch_size=batch, job_name="run", **config)

        ready = os.path.join(daemon.dir, "victim.ready")
        trainers = {}
        for rank in range(gpus):
            extra = dict(pause_after=2, ready_file=ready) if rank == 1 else {}
            trainers[rank] = start("rank%d" % rank, rank=rank, device="cuda:%d" % rank, **extra)
        victim, victim_out, victim_log = trainers[1]
        ferry_it.wait_for_file(ready, 120, [victim])
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
        first = ferry_it.read_json(victim_out)
        state = first["state"]
        self.assertEqual(state["batches_done"], 2)
        results = {}
        for rank, (proc, out, log) in trainers.items():
            if rank == 1:
                continue
            self.assertEqual(proc.wait(180), 0, "rank %d; log:\n%s\nferryd:\n%s"
                             % (rank, ferry_it.tail(log), daemon.log()))
            results[rank] = ferry_it.read_json(out)
            self.assertTrue(results[rank]["done"], results[rank])
        self.assertIsNone(daemon.process.poll(), "ferryd died; log:\n%s" % daemon.log())
        # ferryd frees the dead trainer's rank once its stream ends; a new one resumes.
        proc, out, log = start("rank1-resumed", rank=1, device="cuda:1", resume=state)
        self.assertEqual(proc.wait(180), 0, "%s\nferryd:\n%s" % (ferry_it.tail(log), daemon.log()))
        resumed = ferry_it.read_json(out)
        self.assertTrue(resumed["done"], resumed)
        jobs = ferry_it.ferryctl(daemon.address, "status").get("jobs", [])
        self.assertEqual(len(jobs), 1, jobs)
        seen = [i for r in results.values() for b in r["epochs"]["0"] for i in b["index"]]
        seen += [i for b in first["epochs"]["0"] + resumed["epochs"]["0"] for i in b["index"]]
        self.assertEqual(sorted(seen), list(range(images)), "every sample of the epoch once")
        print("%d GPUs, one job: the trainer on GPU 1 killed after 2 batches, the others "
              "finished, the resumed one read the rest; every sample once" % gpus, flush=True)

    def test_c_a_run_on_every_gpu_resumes_on_one(self):
        import torch
        gpus = torch.cuda.device_count()
        batch = 8
        daemon = ferry_it.FerryDaemon(config="drain_timeout_seconds: 2\n")
        self.addCleanup(daemon.stop)
        images = gpus * batch * 6
        root = ferry_it.make_photo_folder(os.path.join(daemon.dir, "images"), per_class=images // 2)

        def start(name, **config):
            config.setdefault("world_size", gpus)
            config.setdefault("batch_size", batch)
            return self.start_trainer(daemon, name, root=root, **config)

        trainers = [start("rank%d" % r, rank=r, device="cuda:%d" % r, pause_after=2,
                          ready_file=os.path.join(daemon.dir, "rank%d.ready" % r))
                    for r in range(gpus)]
        for r, (proc, _, _) in enumerate(trainers):
            ferry_it.wait_for_file(os.path.join(daemon.dir, "rank%d.ready" % r), 120, [proc])
        first = []
        for proc, out, _ in trainers:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            first.append(ferry_it.read_json(out))
        state = first[0]["state"]
        self.assertEqual(state["consumed"], [[0, 2 * batch * gpus]])
        proc, out, log = start("alone", rank=0, world_size=1, batch_size=5, device="cuda:0",
                               resume=state)
        self.assertEqual(proc.wait(180), 0, "%s\nferryd:\n%s" % (ferry_it.tail(log), daemon.log()))
        alone = ferry_it.read_json(out)
        self.assertTrue(alone["done"], alone)
        seen = [i for r in first + [alone] for b in r["epochs"]["0"] for i in b["index"]]
        self.assertEqual(sorted(seen), list(range(images)), "every sample of the epoch once")
        self.assertTrue(all(b["device"] == "cuda:0" for b in alone["epochs"]["0"]))
        print("%d GPUs saved after 2 batches of %d; resumed on 1 GPU with batch 5: every "
              "sample once" % (gpus, batch), flush=True)


if __name__ == "__main__":
    unittest.main()
