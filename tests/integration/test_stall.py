"""Stall attribution through a real ferryd and the Python Loader: the trainer's
own wait reaches ferryd with its releases, and the rank's limiting stage follows which side
is slow. Each test makes its slow side overwhelmingly slow by construction, so the outcome
does not depend on the machine or its load: a trainer that sleeps 100 ms a batch on tiny
images is named the limit (`trainer`, stall under 10%); one that takes batches as fast as
they come from a single worker that must decode 1024x1024 incompressible PNGs (4 a batch,
each tens of ms of CPU, against well under a millisecond of Python per batch) waits on the
workers (`decode`); one whose main thread shares its only CPU with two spinning processes
is ahead of ferry and short of CPU (`trainer_cpu`). The pipeline's unit tests (server/pipeline/pipeline_test.cc) cover every
stage with fakes; this checks the whole path, with no timing asserted beyond the stage's own
thresholds."""

import os
import subprocess
import sys
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
    def run_trainer(self, step_seconds, slow_decode, run_seconds=3.0, busy_step=False):
        """Iterates a Loader for run_seconds, sleeping step_seconds per batch (busy_step:
        computing for that long instead), and returns rank 0's status read while the trainer
        is still attached. slow_decode: one worker and large noise PNGs; otherwise the
        default workers and tiny JPEGs."""
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
                if busy_step:
                    step_end = time.monotonic() + step_seconds
                    while time.monotonic() < step_end:
                        pass
                elif step_seconds:
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

    def test_a_trainer_that_shares_its_cpu_with_spinners_is_short_of_cpu(self):
        # This thread and two spinning processes on one CPU: computing its 300 ms steps, it
        # waits for the CPU about two thirds of the time, whatever the machine's load, while
        # tiny JPEGs keep ferry far ahead of it.
        original = os.sched_getaffinity(0)
        cpu = min(original)
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        for p in spinners:
            self.addCleanup(p.wait)
            self.addCleanup(p.kill)
            os.sched_setaffinity(p.pid, {cpu})
        os.sched_setaffinity(0, {cpu})  # this thread only: the Loader's own keep theirs
        try:
            rank = self.run_trainer(step_seconds=0.3, slow_decode=False, run_seconds=4.0,
                                    busy_step=True)
        finally:
            os.sched_setaffinity(0, original)
        ratio = float(rank.get("consumer_cpu_wait_ratio", 0))
        if ratio == 0 and not self.kernel_keeps_run_delays():
            self.skipTest("the kernel keeps no run-queue delays (schedstat)")
        self.assertGreater(ratio, 0.3, rank)
        self.assertLess(float(rank.get("stall_ratio", 0)), 0.1, rank)
        self.assertEqual(rank.get("limiting_stage"), "LIMITED_BY_TRAINER_CPU", rank)
        self.assertIn("short of CPU", rank.get("limiting_stage_note", ""), rank)

    @staticmethod
    def kernel_keeps_run_delays():
        with open("/proc/self/schedstat") as f:
            return int(f.read().split()[1]) > 0


if __name__ == "__main__":
    unittest.main()
