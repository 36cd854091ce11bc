"""kill -9 of one rank's process mid-epoch: ferryd reclaims its slots, the other rank is not
disturbed, and a new process takes the rank over and resumes where the dead one stopped."""

import os
import signal
import time
import unittest

import ferry_it

BATCH = 4
WORLD = 2
SEED = 21
PAUSE = 3          # batches each rank takes before the kill
COUNTS = {"ape": 16, "bat": 16}  # 32 samples: 16 per rank, 4 batches of 4


class ConsumerKillTest(unittest.TestCase):
    def setUp(self):
        self.daemon = ferry_it.FerryDaemon()
        self.addCleanup(self.daemon.stop)
        self.dir = self.daemon.dir
        self.root = ferry_it.make_image_folder(os.path.join(self.dir, "images"), COUNTS)

    def worker(self, name, **cfg):
        base = dict(address=self.daemon.address, root=self.root, world_size=WORLD,
                    batch_size=BATCH, seed=SEED, crop=16, job_name="crash",
                    out=os.path.join(self.dir, name + ".json"))
        base.update(cfg)
        proc = ferry_it.start_worker(base, os.path.join(self.dir, name + ".log"))
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(), proc.wait()))
        return proc, base["out"]

    def wait_ok(self, proc, name):
        code = proc.wait(120)
        self.assertEqual(code, 0, "%s failed:\n%s"
                         % (name, ferry_it.tail(os.path.join(self.dir, name + ".log"))))

    def test_sigkill_mid_epoch_reclaims_slots_and_the_rank_can_resume(self):
        ready0, ready1 = os.path.join(self.dir, "ready0"), os.path.join(self.dir, "ready1")
        go0 = os.path.join(self.dir, "go0")
        rank0, out0 = self.worker("rank0", rank=0, epochs=[0, 1], pause_after=PAUSE,
                                  ready_file=ready0, go_file=go0)
        # zero_copy: the victim holds its current batch's slot while it sleeps.
        rank1, out1 = self.worker("rank1", rank=1, epochs=[0, 1], pause_after=PAUSE,
                                  ready_file=ready1, zero_copy=True)
        ferry_it.wait_for_file(ready0, 60, [rank0], "rank 0 readiness")
        ferry_it.wait_for_file(ready1, 60, [rank1], "rank 1 readiness")
        before = ferry_it.read_json(out1)
        job_id = before["job_id"]
        self.assertEqual({k: before["state"][k] for k in ("epoch", "batches_done", "quarantined")},
                         {"epoch": 0, "batches_done": PAUSE, "quarantined": []})

        victim = ferry_it.rank_status(ferry_it.ferryctl(self.daemon.address, "job", job_id), 1)
        self.assertTrue(victim["attached"], victim)
        self.assertEqual(victim.get("batch_channel", False), ferry_it.expect_batch_channel(),
                         victim)
        self.assertGreaterEqual(victim["slots_leased"], 1, victim)

        rank1.send_signal(signal.SIGKILL)
        self.assertEqual(rank1.wait(10), -signal.SIGKILL)
        killed_at = time.monotonic()

        def reclaimed():
            status = ferry_it.ferryctl(self.daemon.address, "job", job_id)
            r = ferry_it.rank_status(status, 1)
            return status if not r["attached"] and r["slots_leased"] == 0 else None

        status = ferry_it.poll(reclaimed, timeout=5)
        self.assertIsNotNone(status, "rank 1 still attached or holding slots 5 s after "
                             "SIGKILL: %s" % ferry_it.ferryctl(self.daemon.address, "job", job_id))
        self.assertLess(time.monotonic() - killed_at, 5)
        # Rank 0 is still attached, mid-epoch, unaffected.
        self.assertTrue(ferry_it.rank_status(status, 0)["attached"])
        self.assertEqual(int(status["errors"]), 0)

        # Rank 0 finishes both epochs normally.
        open(go0, "w").close()
        self.wait_ok(rank0, "rank0")
        r0 = ferry_it.read_json(out0)
        self.assertTrue(r0["done"], r0.get("error"))
        self.assertEqual([len(r0["epochs"][e]["index"]) for e in ("0", "1")], [4, 4])

        # A new process takes rank 1 over and resumes epoch 0 after the batches the dead one
        # had taken, then runs epoch 1.
        again, out_again = self.worker("rank1-again", rank=1, epochs=[0, 1],
                                       resume=before["state"])
        self.wait_ok(again, "rank1-again")
        r1 = ferry_it.read_json(out_again)
        self.assertTrue(r1["done"], r1.get("error"))
        self.assertEqual(r1["job_id"], job_id)
        resumed = r1["epochs"]["0"]["index"]
        self.assertEqual(len(resumed), r1["len"] - PAUSE)
        for epoch, rank1_batches in (("0", before["epochs"]["0"]["index"] + resumed),
                                     ("1", r1["epochs"]["1"]["index"])):
            rank0_batches = r0["epochs"][epoch]["index"]
            self.assertEqual(len(rank1_batches), len(rank0_batches))
            every = sorted(i for b in rank0_batches + rank1_batches for i in b)
            self.assertEqual(every, list(range(32)), "epoch %s: every sample exactly once "
                             "across rank 0 and the two rank-1 processes" % epoch)

        final = ferry_it.rank_status(ferry_it.ferryctl(self.daemon.address, "job", job_id), 1)
        self.assertFalse(final["attached"])
        self.assertEqual(final["slots_leased"], 0)
        self.assertEqual(ferry_it.run_ferryctl(self.daemon.address, "status").returncode, 0)


if __name__ == "__main__":
    unittest.main()
