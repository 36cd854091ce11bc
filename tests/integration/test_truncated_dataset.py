"""A dataset file truncated by its owner while a job reads it (one os.truncate by any user
of a shared ferryd must not kill it for everyone): the job stops with an error that names
the file and says what to do, the trainer gets it as a FerryError, and ferryd goes on
serving another trainer's job."""

import os
import unittest

import numpy as np

import ferry
import ferry_it


class TruncatedDatasetTest(unittest.TestCase):
    def test_truncating_a_token_file_under_a_job_stops_only_that_job(self):
        daemon = ferry_it.FerryDaemon()
        self.addCleanup(daemon.stop)
        victim_path = os.path.join(daemon.dir, "alice.bin")
        other_path = os.path.join(daemon.dir, "bob.bin")
        for path in (victim_path, other_path):
            (np.arange(1 << 20) % 50000).astype(np.uint16).tofile(path)  # 2 MiB, 512 pages
        alice = ferry.Loader(ferry.Tokens(victim_path, seq_len=1024), batch_size=8,
                             address=daemon.address, as_numpy=True, timeout=30, prefetch=2)
        self.addCleanup(alice.close)
        bob = ferry.Loader(ferry.Tokens(other_path, seq_len=1024), batch_size=8,
                           address=daemon.address, as_numpy=True, timeout=30, prefetch=2)
        self.addCleanup(bob.close)
        it = iter(alice)
        for _ in range(3):
            next(it)
        os.truncate(victim_path, 4096)
        with self.assertRaises(ferry.FerryError) as cm:
            for _ in it:
                pass
        message = cm.exception.message
        self.assertIn("alice.bin", message)
        self.assertIn("shrank while the job read it", message)
        self.assertIn("create the job again", message)
        # ferryd is alive and serves the other job to its end.
        self.assertIsNone(daemon.process.poll(), "ferryd died; log:\n%s" % daemon.log())
        self.assertEqual(sum(1 for _ in bob), len(bob))
        status = ferry_it.ferryctl(daemon.address, "status")
        self.assertEqual(len(status.get("jobs", [])), 2)


if __name__ == "__main__":
    unittest.main()
