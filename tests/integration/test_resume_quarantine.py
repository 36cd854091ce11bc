"""Resume across a ferryd restart stays exact when a sample was quarantined in an earlier
epoch. The hard case is a JPEG that is cut short: ferry decodes only the rows a crop needs,
so the file fails for crops reaching its missing rows and decodes for the others. An
uninterrupted run quarantines it in the epoch where it fails and substitutes it from then on;
a new ferryd would read it again and, for a crop that fits, deliver it. The resume state
carries the quarantine to the new ferryd, so index and pixel streams match the uninterrupted
run, at the end of an epoch and in the middle of one."""

import io
import os
import unittest

import numpy as np

import ferry
import ferry_it

try:
    from PIL import Image
except ImportError:
    Image = None

BATCH = 4


def cut_short_jpeg(path):
    """A noisy 64x256 JPEG with only its first 45% of bytes: the top rows decode."""
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (256, 64, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    data = out.getvalue()
    with open(path, "wb") as f:
        f.write(data[:int(len(data) * 0.45)])


def read(loader, epoch=None, batches=None):
    """(indices, images) of the next iteration, up to `batches` batches."""
    if epoch is not None:
        loader.set_epoch(epoch)
    indices, images = [], []
    for i, batch in enumerate(loader):
        indices.append(batch["index"].tolist())
        images.append(batch["image"].copy())
        if batches is not None and i + 1 == batches:
            break
    return indices, images


@unittest.skipUnless(Image is not None, "PIL is not installed")
class ResumeAcrossRestartTest(unittest.TestCase):
    def setUp(self):
        self.daemon = ferry_it.FerryDaemon(config="job_idle_timeout_seconds: 0\n")
        self.addCleanup(self.daemon.stop)
        self.root = ferry_it.make_image_folder(os.path.join(self.daemon.dir, "images"),
                                               {"a": 5, "b": 5, "c": 5})
        cut_short_jpeg(os.path.join(self.root, "a", "zz_cut.jpg"))
        self.bad = 5  # a/ sorted: a0..a4 then zz_cut.jpg

    def loader(self, seed, name):
        loader = ferry.Loader(ferry.ImageFolder(self.root), batch_size=BATCH,
                              transform=ferry.RandomResizedCrop(16), shuffle=True, seed=seed,
                              address=self.daemon.address, job_name=name, as_numpy=True,
                              timeout=60)
        self.addCleanup(loader.close)
        return loader

    def quarantined_in(self, seed, epoch):
        """Whether a job that starts with `epoch` finds the cut-short file bad in it."""
        loader = self.loader(seed, "probe-%d-%d" % (seed, epoch))
        read(loader, epoch)
        bad = self.bad in loader.state_dict()["quarantined"]
        loader.close()
        return bad

    def test_resume_after_a_restart_matches_the_uninterrupted_run(self):
        # A seed whose epoch-0 crop of the file reaches its missing rows and whose epoch-1
        # crop does not: only the quarantine from epoch 0 keeps epoch 1 the same.
        seed = next((s for s in range(80)
                     if self.quarantined_in(s, 0) and not self.quarantined_in(s, 1)), None)
        self.assertIsNotNone(seed, "no seed makes the cut-short JPEG fail only in epoch 0")

        uninterrupted = self.loader(seed, "run")
        read(uninterrupted, 0)
        self.assertEqual(uninterrupted.state_dict()["quarantined"], [self.bad])
        epoch1 = read(uninterrupted, 1)
        epoch2 = read(uninterrupted, 2)
        self.assertNotIn(self.bad, sum(epoch1[0], []), "epoch 1 delivered the quarantined file")

        # Saved at the end of epoch 0; ferryd killed and started again; resumed.
        run = self.loader(seed, "resumed")
        read(run, 0)
        end_of_epoch0 = run.state_dict()
        self.assertEqual(end_of_epoch0["quarantined"], [self.bad])
        run.close()
        self.daemon.restart()
        resumed = self.loader(seed, "resumed")
        resumed.load_state_dict(end_of_epoch0)
        got = read(resumed, 1)
        self.assertEqual(got[0], epoch1[0])
        for mine, theirs in zip(got[1], epoch1[1]):
            np.testing.assert_array_equal(mine, theirs)

        # Saved in the middle of epoch 2, after another restart.
        resumed.set_epoch(2)
        head = read(resumed, 2, batches=2)
        middle = resumed.state_dict()
        resumed.close()
        self.daemon.restart()
        again = self.loader(seed, "resumed")
        again.load_state_dict(middle)
        again.set_epoch(2)
        tail = read(again)
        self.assertEqual(head[0] + tail[0], epoch2[0])
        for mine, theirs in zip(head[1] + tail[1], epoch2[1]):
            np.testing.assert_array_equal(mine, theirs)


if __name__ == "__main__":
    unittest.main()
