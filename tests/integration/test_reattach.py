"""A Loader whose ferryd stays away longer than the reattach patience raises a FerryError;
iterating it again once ferryd is back attaches again and delivers the epoch, as iterating
again always does (it used to raise AttributeError: 'NoneType' object has no attribute
'start_epoch')."""

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


if __name__ == "__main__":
    unittest.main()
