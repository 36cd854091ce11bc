"""A Loader whose ferryd stays away longer than the reattach patience raises a FerryError;
iterating it again once ferryd is back attaches again and delivers the epoch, as iterating
again always does (it used to raise AttributeError: 'NoneType' object has no attribute
'start_epoch'). A new Loader in a process whose earlier Loaders used a ferryd that was then
killed and started again connects to the new one (it used to fail its first call with
UNAVAILABLE "Broken pipe": gRPC handed it the dead connection of an earlier client)."""

import os
import signal
import unittest

import ferry
import ferry_it


class ReattachTest(unittest.TestCase):
    def test_a_loader_whose_reattach_gave_up_attaches_on_the_next_iteration(self):
        os.environ["FERRY_REATTACH_SECONDS"] = "1"
        self.addCleanup(os.environ.pop, "FERRY_REATTACH_SECONDS", None)
        daemon = ferry_it.FerryDaemon()
        self.addCleanup(daemon.stop)
        loader = ferry_it.tokens_loader(daemon, 1 << 16, seq_len=64, batch_size=8)
        self.addCleanup(loader.close)
        it = iter(loader)
        first = [int(i) for i in next(it)["index"]]
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(10)
        with self.assertRaises(ferry.FerryError) as cm:
            for _ in it:
                pass
        self.assertIn("did not take the job back", cm.exception.message)
        daemon.restart(sig=signal.SIGKILL)  # (already dead) a ferryd on the same socket
        again = [int(i) for b in loader for i in b["index"]]
        self.assertEqual(len(again), ((1 << 16) - 1) // 64)  # every sample of the file
        self.assertEqual(len(set(again)), len(again))
        self.assertEqual(again[:8], first)  # the same epoch, from its start

    def test_new_loaders_after_ferryd_restarts_connect_to_the_new_ferryd(self):
        import numpy as np
        daemon = ferry_it.FerryDaemon()
        self.addCleanup(daemon.stop)
        path = os.path.join(daemon.dir, "t.bin")
        (np.arange(1 << 14) % 50000).astype(np.uint16).tofile(path)
        for _ in range(5):
            # A run of 4 ranks, each mid-epoch when the run stops.
            loaders = [ferry.Loader(ferry.Tokens(path, seq_len=64), batch_size=8, rank=r,
                                    world_size=4, address=daemon.address, as_numpy=True,
                                    timeout=30) for r in range(4)]
            iterators = [iter(loader) for loader in loaders]
            for it in iterators:
                self.assertEqual(len(next(it)["index"]), 8)
            for loader in loaders:
                loader.close()
            daemon.restart(signal.SIGKILL)


class LibraryTakesTheJobBackTest(unittest.TestCase):
    """libferry itself (through its C ABI, as C and C++ trainers use it) takes a job back on a
    restarted ferryd: ferry.Client / Consumer here, not the Loader."""

    def setUp(self):
        import numpy as np
        self.daemon = ferry_it.FerryDaemon()
        self.addCleanup(self.daemon.stop)
        path = os.path.join(self.daemon.dir, "t.bin")
        (np.arange(1 << 14) % 50000).astype(np.uint16).tofile(path)
        self.spec = {"dataset": {"tokens": {"path": path, "seq_len": 16, "token_dtype": "UINT16",
                                            "output_dtype": "INT64"}}, "batch_size": 8,
                     "shuffle": True, "seed": 3}

    def client(self):
        client = ferry.Client(self.daemon.address)
        self.addCleanup(client.close)
        return client

    def attach(self, client, job_id):
        consumer = client.attach(job_id, 0)
        self.addCleanup(consumer.close)
        return consumer

    @staticmethod
    def take(consumer, count=None):
        """The sample indices of the next `count` batches (all that are left: None)."""
        out = []
        while count is None or count > 0:
            batch = consumer.next(30000)
            if batch is None:
                break
            out.append([int(i) for i in batch.arrays()["index"]])
            batch.release()
            count = None if count is None else count - 1
        return out

    def test_the_epoch_goes_on_on_the_new_ferryd_with_the_jobs_quarantine(self):
        reference = self.client()
        ref_job = reference.create_job(self.spec, name="ref")
        ref = self.attach(reference, ref_job["id"])
        ref.start_epoch(1)
        expected = self.take(ref)
        ref.close()
        reference.delete_job(ref_job["id"])

        client = self.client()
        hooks = []
        client.set_reattach(30, lambda: hooks.append(1))
        job = client.create_job(self.spec, name="ref")
        # A sample quarantined through the client is quarantined on the new ferryd too.
        bad = expected[10][0]
        self.assertEqual(client.quarantine(job["id"], [bad]), 1)
        consumer = self.attach(client, job["id"])
        consumer.start_epoch(1)
        got = self.take(consumer, 3)
        self.daemon.restart(signal.SIGKILL)
        got += self.take(consumer)
        self.assertEqual(consumer.attaches, 2)
        self.assertGreaterEqual(len(hooks), 1)
        # The same batches as an uninterrupted run, but the quarantined sample's substitute.
        self.assertEqual(len(got), len(expected))
        differ = [(b, r) for b in range(len(got)) for r in range(len(got[b]))
                  if got[b][r] != expected[b][r]]
        self.assertEqual([expected[b][r] for b, r in differ], [bad])
        # The id the client returned names the job created again.
        status = client.get_job(job["id"])
        self.assertNotEqual(status["job"]["id"], job["id"])
        self.assertEqual([int(i) for i in status["quarantined_indices"]], [bad])
        # The next epoch runs on the new ferryd as usual.
        consumer.start_epoch(2)
        self.assertEqual(len(self.take(consumer)), len(expected))

    def test_a_job_this_client_did_not_create_or_no_patience_fails_at_once(self):
        creator = self.client()
        job = creator.create_job(self.spec, name="run")
        other = self.client()
        other.set_reattach(30)
        borrowed = self.attach(other, job["id"])  # a job another client created
        borrowed.start_epoch(0)
        self.take(borrowed, 1)
        impatient = self.client()
        mine = impatient.create_job(dict(self.spec, seed=4), name="mine")
        own = self.attach(impatient, mine["id"])
        own.start_epoch(0)
        self.take(own, 1)
        self.daemon.restart(signal.SIGKILL)
        for consumer in (borrowed, own):
            with self.assertRaises(ferry.FerryError) as cm:
                self.take(consumer)
            self.assertEqual(cm.exception.code, "UNAVAILABLE")
            # The stream's own error: no attempt to take the job back was made.
            self.assertNotIn("take the job back", cm.exception.message)
            self.assertEqual(consumer.attaches, 1)

    def test_a_failing_reconnect_hook_ends_the_wait_with_its_error(self):
        client = self.client()

        def refuse():
            raise ferry.FerryError("PERMISSION_DENIED", "the hook says no")
        client.set_reattach(30, refuse)
        job = client.create_job(self.spec)
        consumer = self.attach(client, job["id"])
        consumer.start_epoch(0)
        self.take(consumer, 1)
        self.daemon.restart(signal.SIGKILL)
        with self.assertRaises(ferry.FerryError) as cm:
            self.take(consumer)
        self.assertEqual(cm.exception.code, "UNAVAILABLE")
        self.assertIn("did not take the job back", cm.exception.message)
        self.assertIn("the hook says no", cm.exception.message)


if __name__ == "__main__":
    unittest.main()
