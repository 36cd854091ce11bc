"""Exact resume (a trainer killed with -9, alone or together with ferryd), two ferryd
instances serving one job's ranks without a coordinator, and independent jobs side by side.

Streams are compared by sample index and by a digest of every delivered image row, so a
resume that lands on the right samples with the wrong augmentation fails too."""

import os
import signal
import unittest

import ferry_it

BATCH = 4
SEED = 11


class Harness(unittest.TestCase):
    def make_daemon(self):
        daemon = ferry_it.FerryDaemon()
        self.addCleanup(daemon.stop)
        return daemon

    def worker(self, daemon, root, name, **cfg):
        base = dict(address=daemon.address, root=root, world_size=1, rank=0,
                    batch_size=BATCH, seed=SEED, crop=16, job_name=name,
                    out=os.path.join(self.dir, name + ".json"))
        base.update(cfg)
        proc = ferry_it.start_worker(base, os.path.join(self.dir, name + ".log"))
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(), proc.wait()))
        return proc, base["out"]

    def finish(self, proc, out, name):
        code = proc.wait(120)
        self.assertEqual(code, 0, "%s failed:\n%s"
                         % (name, ferry_it.tail(os.path.join(self.dir, name + ".log"))))
        result = ferry_it.read_json(out)
        self.assertTrue(result["done"], result.get("error"))
        return result

    def pause(self, daemon, root, name, after, **cfg):
        """A worker that takes `after` batches of its first epoch, saves its state and
        sleeps until killed; returns (process, its saved result)."""
        ready = os.path.join(self.dir, name + ".ready")
        proc, out = self.worker(daemon, root, name, pause_after=after, ready_file=ready, **cfg)
        ferry_it.wait_for_file(ready, 60, [proc], name + " readiness")
        return proc, ferry_it.read_json(out)

    @staticmethod
    def stream(result, epoch, key):
        return result["epochs"][str(epoch)][key]


class ResumeTest(Harness):
    def setUp(self):
        self.daemon = self.make_daemon()
        self.dir = self.daemon.dir
        self.root = ferry_it.make_image_folder(os.path.join(self.dir, "images"),
                                               {"owl": 13, "yak": 14})  # 27: a short batch

    def test_kill_9_and_ferryd_restart_resume_exactly(self):
        ref = self.finish(*self.worker(self.daemon, self.root, "ref", epochs=[0, 1]), "ref")
        self.assertEqual(ref["len"], 7)

        victim, before = self.pause(self.daemon, self.root, "victim", 3, epochs=[0, 1])
        self.assertEqual({k: before["state"][k] for k in ("epoch", "batches_done", "quarantined")},
                         {"epoch": 0, "batches_done": 3, "quarantined": []})
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        # ferryd dies too (kill -9: no drain) and comes back on the same socket with no
        # memory of the job; the resumed trainer recreates it from the same spec.
        self.daemon.restart(signal.SIGKILL)

        after = self.finish(*self.worker(self.daemon, self.root, "resumed", epochs=[0, 1],
                                         resume=before["state"], job_name="victim"),
                            "resumed")
        self.assertNotEqual(after["job_id"], before["job_id"])
        for key in ("index", "digest", "label"):
            self.assertEqual(self.stream(before, 0, key)[:3] + self.stream(after, 0, key),
                             self.stream(ref, 0, key), key)
            self.assertEqual(self.stream(after, 1, key), self.stream(ref, 1, key), key)

    def test_a_trainer_goes_on_by_itself_after_ferryd_restarts(self):
        # The Loader of a trainer that lives through a ferryd restart (systemd's Restart=,
        # SIGTERM for an upgrade) attaches again on its own and continues its epoch: the
        # streams are those of an uninterrupted run, nothing lost or repeated.
        ref = self.finish(*self.worker(self.daemon, self.root, "ref", epochs=[0, 1]), "ref")
        for sig in (signal.SIGKILL, signal.SIGTERM):
            name = "survivor-%d" % sig
            go = os.path.join(self.dir, name + ".go")
            ready = os.path.join(self.dir, name + ".ready")
            proc, out = self.worker(self.daemon, self.root, name, epochs=[0, 1], pause_after=3,
                                    go_file=go, ready_file=ready)
            ferry_it.wait_for_file(ready, 60, [proc], name + " readiness")
            self.daemon.restart(sig)
            open(go, "w").close()
            result = self.finish(proc, out, name)
            for key in ("index", "digest", "label"):
                for epoch in (0, 1):
                    self.assertEqual(self.stream(result, epoch, key),
                                     self.stream(ref, epoch, key), (sig, epoch, key))
            self.assertIn("taking job '", ferry_it.tail(os.path.join(self.dir, name + ".log")))

    def test_one_rank_restarts_alone_while_the_other_continues(self):
        refs = [self.finish(*self.worker(self.daemon, self.root, "ref%d" % r, rank=r,
                                         world_size=2, epochs=[2]), "ref%d" % r)
                for r in (0, 1)]
        go = os.path.join(self.dir, "go")
        rank0, out0 = self.worker(self.daemon, self.root, "rank0", rank=0, world_size=2,
                                  epochs=[2], pause_after=1, go_file=go,
                                  ready_file=os.path.join(self.dir, "rank0.ready"),
                                  job_name="run")
        victim, before = self.pause(self.daemon, self.root, "rank1", 2, rank=1, world_size=2,
                                    epochs=[2], job_name="run", zero_copy=True)
        ferry_it.wait_for_file(os.path.join(self.dir, "rank0.ready"), 60, [rank0])
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        open(go, "w").close()  # rank 0 goes on while rank 1 is down
        r0 = self.finish(rank0, out0, "rank0")
        r1 = self.finish(*self.worker(self.daemon, self.root, "rank1-again", rank=1,
                                      world_size=2, epochs=[2], job_name="run",
                                      resume=before["state"]), "rank1-again")
        self.assertEqual(r1["job_id"], before["job_id"])  # same job, rank re-attached
        for key in ("index", "digest"):
            self.assertEqual(self.stream(r0, 2, key), self.stream(refs[0], 2, key))
            self.assertEqual(self.stream(before, 2, key)[:2] + self.stream(r1, 2, key),
                             self.stream(refs[1], 2, key))


class MultiNodeTest(Harness):
    """Ranks {0, 1} on ferryd A and {2, 3} on ferryd B of one W = 4 job: both compute the
    same order from the same spec; nothing connects them."""

    def setUp(self):
        self.a, self.b = self.make_daemon(), self.make_daemon()
        self.dir = self.a.dir

    def run_world(self, root, name, **cfg):
        procs = []
        for rank in range(4):
            daemon = self.a if rank < 2 else self.b
            procs.append(self.worker(daemon, root, "%s%d" % (name, rank), rank=rank,
                                     world_size=4, epochs=[0, 1], job_name=name, **cfg))
        return [self.finish(p, out, "%s%d" % (name, r)) for r, (p, out) in enumerate(procs)]

    def test_divisible_dataset_every_sample_exactly_once_per_epoch(self):
        root = ferry_it.make_image_folder(os.path.join(self.dir, "d40"), {"a": 20, "b": 20})
        ranks = self.run_world(root, "div")
        for epoch in (0, 1):
            counts = [len(self.stream(r, epoch, "index")) for r in ranks]
            self.assertEqual(counts, [3] * 4)  # 10 per rank: 4 + 4 + 2
            every = sorted(i for r in ranks for b in self.stream(r, epoch, "index") for i in b)
            self.assertEqual(every, list(range(40)), "epoch %d" % epoch)
        self.assertNotEqual(self.stream(ranks[0], 0, "index"), self.stream(ranks[0], 1, "index"))

    def test_indivisible_dataset_pads_or_drops_as_documented(self):
        root = ferry_it.make_image_folder(os.path.join(self.dir, "d42"), {"a": 21, "b": 21})
        # drop_last=False: padded to 44 by repeating the head of the order, 11 per rank.
        padded = self.run_world(root, "pad")
        # drop_last=True: cut to 40, 10 per rank, and the trailing partial batch dropped.
        dropped = self.run_world(root, "drop", drop_last=True)
        for epoch in (0, 1):
            rows = [i for r in padded for b in self.stream(r, epoch, "index") for i in b]
            self.assertEqual(len(rows), 44)
            self.assertEqual(set(rows), set(range(42)))
            self.assertEqual([len(self.stream(r, epoch, "index")) for r in padded], [3] * 4)
            rows = [i for r in dropped for b in self.stream(r, epoch, "index") for i in b]
            self.assertEqual(len(rows), 32)
            self.assertEqual(len(set(rows)), 32)  # no sample twice
            self.assertEqual([len(self.stream(r, epoch, "index")) for r in dropped], [2] * 4)


class SeveralJobsTest(Harness):
    def test_a_stalled_consumer_never_stalls_another_job(self):
        daemon = self.make_daemon()
        self.dir = daemon.dir
        slow_root = ferry_it.make_image_folder(os.path.join(self.dir, "slow"), {"a": 40})
        fast_root = ferry_it.make_image_folder(os.path.join(self.dir, "fast"), {"b": 20, "c": 20})
        # The stalled consumer takes one batch and then holds it, never asking for more.
        stalled, _ = self.pause(daemon, slow_root, "stalled", 1, epochs=[0], zero_copy=True)
        fast = self.finish(*self.worker(daemon, fast_root, "fast", epochs=[0, 1, 2]), "fast")
        self.assertEqual([len(fast["epochs"][e]["index"]) for e in ("0", "1", "2")], [10] * 3)
        jobs = {j["job"]["name"]: j for j in
                ferry_it.ferryctl(daemon.address, "status")["jobs"]}
        held = ferry_it.rank_status(jobs["stalled"], 0)
        self.assertTrue(held["attached"])
        self.assertGreaterEqual(int(held["slots_leased"]), 1)
        self.assertIsNone(stalled.poll())


if __name__ == "__main__":
    unittest.main()
