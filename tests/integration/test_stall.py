"""Stall attribution through a real ferryd and the Python Loader (issue 23): the trainer's
own wait reaches ferryd with its releases, and the rank's limiting stage follows which side
is slow. A trainer that sleeps between batches is named the limit (`trainer`, stall under
10%); one that takes batches as fast as they come, on a dataset whose samples must be
decoded and scaled up, waits on the workers (`decode`). The pipeline's unit tests
(server/pipeline/pipeline_test.cc) cover every stage with fakes; this checks the whole path,
with no timing asserted beyond the stage's own thresholds."""

import os
import time
import unittest

import ferry

import ferry_it


def rank0(daemon):
    status = ferry_it.ferryctl(daemon.address, "status")
    jobs = status.get("jobs", [])
    assert len(jobs) == 1, status
    return ferry_it.rank_status(jobs[0], 0)


class StallTest(unittest.TestCase):
    def run_trainer(self, step_seconds, run_seconds=3.0):
        """Iterates a Loader for run_seconds, sleeping step_seconds per batch, and returns
        rank 0's status read while the trainer is still attached."""
        daemon = ferry_it.FerryDaemon()
        self.addCleanup(daemon.stop)
        root = ferry_it.make_image_folder(os.path.join(daemon.dir, "images"),
                                          {"cat": 150, "dog": 150})
        loader = ferry.Loader(ferry.ImageFolder(root), batch_size=4,
                              transform=ferry.RandomResizedCrop(320, flip=True), shuffle=True,
                              seed=3, drop_last=True, address=daemon.address)
        self.addCleanup(loader.close)
        end = time.monotonic() + run_seconds
        batches = 0
        epoch = 0
        while time.monotonic() < end:
            loader.set_epoch(epoch)
            for batch in loader:
                self.assertEqual(tuple(batch["image"].shape), (4, 320, 320, 3))
                batches += 1
                if step_seconds:
                    time.sleep(step_seconds)
                if time.monotonic() >= end:
                    break
            epoch += 1
        status = rank0(daemon)  # the loader is still attached, mid-epoch
        self.assertGreater(batches, 0)
        return status

    def test_a_slow_trainer_is_the_limit(self):
        rank = self.run_trainer(step_seconds=0.05)
        self.assertEqual(rank.get("limiting_stage"), "LIMITED_BY_TRAINER", rank)
        self.assertLess(float(rank.get("stall_ratio", 0)), 0.1, rank)
        # The trainer's own waits arrived with its releases.
        self.assertIn("as it measured", rank.get("limiting_stage_note", ""), rank)

    def test_a_trainer_that_takes_batches_at_once_waits_on_decode(self):
        rank = self.run_trainer(step_seconds=0)
        self.assertEqual(rank.get("limiting_stage"), "LIMITED_BY_DECODE", rank)
        self.assertGreater(float(rank.get("stall_ratio", 0)), 0.1, rank)
        self.assertIn("as it measured", rank.get("limiting_stage_note", ""), rank)


if __name__ == "__main__":
    unittest.main()
