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

if __name__ == "__main__":
    unittest.main()
