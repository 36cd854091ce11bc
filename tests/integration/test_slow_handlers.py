"""CreateJob and Attach run on ferryd's handler threads, not on gRPC's reactor threads:
while one user's CreateJobs build large blends (seconds each), `ferryctl status` and another
user's calls are answered at once. Slow handlers on the reactor left every other call
unanswered until they were done."""

import os
import threading
import time
import unittest

import numpy as np

import ferry
import ferry_it


def blend_spec(path, positions):
    tokens = {"tokens": {"path": path, "tokenDtype": "UINT16", "seqLen": 16}}
    return {"dataset": {"blend": {"sources": [{"dataset": tokens, "weight": 1.0},
                                              {"dataset": tokens, "weight": 3.0}],
                                  "samplesPerEpoch": str(positions)}},
            "batchSize": 8}


class SlowHandlersTest(unittest.TestCase):
    def test_status_is_answered_while_blends_are_built(self):
        daemon = ferry_it.FerryDaemon()
        self.addCleanup(daemon.stop)
        path = os.path.join(daemon.dir, "t.bin")
        (np.arange(1 << 12) % 50000).astype(np.uint16).tofile(path)
        # How long one such blend takes here: the slow side is slow by construction.
        client = ferry.Client(daemon.address)
        self.addCleanup(client.close)
        positions = 1 << 26
        start = time.monotonic()
        client.create_job(blend_spec(path, positions), name="probe")
        one = time.monotonic() - start

        errors = []

        def create(i):
            try:
                with ferry.Client(daemon.address) as c:
                    c.create_job(blend_spec(path, positions), name="big-%d" % i)
            except Exception as e:  # reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        time.sleep(min(one, 0.5))  # the blends are being built now
        answers = []
        while any(t.is_alive() for t in threads):
            start = time.monotonic()
            proc = ferry_it.run_ferryctl(daemon.address, "--json", "status", timeout=60)
            answers.append(time.monotonic() - start)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            time.sleep(0.1)
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertGreater(len(answers), 0, "the blends were built before status was asked")
        # A status takes milliseconds; a blend about `one` seconds, and eight of them queue.
        self.assertLess(max(answers), max(2.0, one / 2),
                        "status waited for the blends (one took %.1f s): %s" % (one, answers))
        self.assertEqual(len(ferry_it.ferryctl(daemon.address, "status")["jobs"]), 9)


if __name__ == "__main__":
    unittest.main()
