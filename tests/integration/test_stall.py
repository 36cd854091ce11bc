"""Stall attribution through a real ferryd and the Python Loader (issue 23): the trainer's
own wait reaches ferryd with its releases, and the rank's limiting stage follows which side
is slow. Each test makes its slow side overwhelmingly slow by construction, so the outcome
does not depend on the machine or its load: a trainer that sleeps 100 ms a batch on tiny
images is named the limit (`trainer`, stall under 10%); one that takes batches as fast as
they come from a single worker that must decode 1024x1024 incompressible PNGs (4 a batch,
each tens of ms of CPU, against well under a millisecond of Python per batch) waits on the
workers (`decode`). The pipeline's unit tests (server/pipeline/pipeline_test.cc) cover every
stage with fakes; this checks the whole path, with no timing asserted beyond the stage's own
thresholds."""

import os
import time
import unittest

import numpy as np
from PIL import Image

import ferry

import ferry_it


def rank0(daemon):
    status = ferry_it.ferryctl(daemon.address, "status")
    jobs = status.get("jobs", [])
    assert len(jobs) == 1, status
    return ferry_it.rank_status(jobs[0], 0)


def make_noise_png_folder(root, per_class, side=1024):
    """root/{a,b}/<i>.png: side x side RGB noise, stored with light compression, so every
    decode inflates ~3 MiB and filters every row (no reduced-scale decode exists for PNG)."""
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        os.makedirs(os.path.join(root, name))
        for i in range(per_class):
            pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(os.path.join(root, name, "%d.png" % i),
                                         compress_level=1)
    return root


class StallTest(unittest.TestCase):
    def run_trainer(self, step_seconds, slow_decode, run_seconds=3.0):
        """Iterates a Loader for run_seconds, sleeping step_seconds per batch, and returns
        rank 0's status read while the trainer is still attached. slow_decode: one worker
        and large noise PNGs; otherwise the default workers and tiny JPEGs."""
        daemon = ferry_it.FerryDaemon(config="workers_per_node: 1" if slow_decode else None)
        self.addCleanup(daemon.stop)
        images = os.path.join(daemon.dir, "images")
        if slow_decode:
            root = make_noise_png_folder(images, per_class=8)
        else:
            root = ferry_it.make_image_folder(images, {"cat": 150, "dog": 150})
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
        rank = self.run_trainer(step_seconds=0.1, slow_decode=False)
        self.assertEqual(rank.get("limiting_stage"), "LIMITED_BY_TRAINER", rank)
        self.assertLess(float(rank.get("stall_ratio", 0)), 0.1, rank)
        # The trainer's own waits arrived with its releases.
        self.assertIn("as it measured", rank.get("limiting_stage_note", ""), rank)

    def test_a_trainer_that_takes_batches_at_once_waits_on_decode(self):
        rank = self.run_trainer(step_seconds=0, slow_decode=True)
        self.assertEqual(rank.get("limiting_stage"), "LIMITED_BY_DECODE", rank)
        self.assertGreater(float(rank.get("stall_ratio", 0)), 0.1, rank)
        self.assertIn("as it measured", rank.get("limiting_stage_note", ""), rank)


if __name__ == "__main__":
    unittest.main()
