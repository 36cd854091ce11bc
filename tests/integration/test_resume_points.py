"""Resume points from libferry (Consumer.position / resume, C ABI 1.9), as C and C++
trainers use them: a run stopped after some batches and resumed on another world size and
batch size delivers the rest of the epoch exactly once; one resumed with the deal it was
taken with goes on with the same batches; a point taken after an epoch's end starts the
next."""

import os
import unittest

import numpy as np

import ferry
import ferry_it

TOKENS = 1 << 14  # 1,023 windows of 16 + 1
SEQ_LEN = 16


class ResumePointTest(unittest.TestCase):
    def setUp(self):
        self.daemon = ferry_it.FerryDaemon()
        self.addCleanup(self.daemon.stop)
        path = os.path.join(self.daemon.dir, "t.bin")
        (np.arange(TOKENS) % 50000).astype(np.uint16).tofile(path)
        self.client = ferry.Client(self.daemon.address)
        self.addCleanup(self.client.close)

    def run_of(self, name, world_size, batch_size):
        """The consumers of every rank of a job over the same data and order."""
        spec = {"dataset": {"tokens": {"path": os.path.join(self.daemon.dir, "t.bin"),
                                       "seq_len": SEQ_LEN}},
                "batch_size": batch_size, "world_size": world_size, "shuffle": True,
                "seed": 7}
        job = self.client.create_job(spec, name=name)
        consumers = [self.client.attach(job["id"], r) for r in range(world_size)]
        for c in consumers:
            self.addCleanup(c.close)
        return consumers

    @staticmethod
    def take(consumer, count=None):
        out = []
        while count is None or len(out) < count:
            batch = consumer.next(30000)
            if batch is None:
                break
            out.append([int(i) for i in batch.arrays()["index"]])
            batch.release()
        return out

    def test_another_world_size_gets_the_rest_of_the_epoch_once(self):
        first = self.run_of("first", 2, 8)
        taken = []
        for c in first:
            c.start_epoch(1)
            taken += [i for b in self.take(c, 3) for i in b]
        points = [c.position() for c in first]
        self.assertEqual(points[0], points[1])  # every rank of a run in step has the same
        point = points[0]
        self.assertEqual((point["epoch"], point["batches_done"]), (1, 3))
        self.assertEqual(point["consumed"], [[0, 48]])
        for c in first:
            c.close()
        rest = []
        for c in self.run_of("second", 3, 5):
            self.assertEqual(c.resume(point), (1, 0))
            rest += [i for b in self.take(c) for i in b]
        self.assertEqual(sorted(taken + rest), list(range((TOKENS - 1) // SEQ_LEN)))

    def test_the_same_deal_goes_on_with_the_same_batches(self):
        reference = self.run_of("reference", 2, 8)[0]
        reference.start_epoch(1)
        whole = self.take(reference)
        reference.close()
        stopped = self.run_of("stopped", 2, 8)[0]
        stopped.start_epoch(1)
        self.take(stopped, 5)
        point = stopped.position()
        stopped.close()
        resumed = self.run_of("resumed", 2, 8)[0]
        self.assertEqual(resumed.resume(point), (1, 5))
        self.assertEqual(self.take(resumed), whole[5:])

    def test_a_point_after_the_epochs_end_starts_the_next(self):
        consumer = self.run_of("ended", 1, 64)[0]
        consumer.start_epoch(3)
        self.take(consumer)
        point = consumer.position()
        self.assertEqual((point["epoch"], point["batches_done"], point["consumed"]), (4, 0, []))
        self.assertEqual(consumer.resume(point), (4, 0))
        self.assertEqual(len(self.take(consumer)), 16)  # 1,023 windows in batches of 64


if __name__ == "__main__":
    unittest.main()
