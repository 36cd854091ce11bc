"""Corrupt samples and hostile files: the SKIP policy's deterministic substitutes and
quarantine, the FAIL policy's stop naming the file, and the decoder limits (built-in
defaults and from the config file), all seen through the Python Loader and ferryctl."""

import os
import time
import unittest

import ferry
import ferry_it


def huge_header_jpeg(good):
    """`good` with its frame header patched to declare 60000 x 60000 pixels."""
    data = bytearray(good)
    for i in range(len(data) - 9):
        if data[i] == 0xFF and data[i + 1] in (0xC0, 0xC2):
            data[i + 5:i + 9] = bytes([60000 >> 8, 60000 & 0xFF, 60000 >> 8, 60000 & 0xFF])
            return bytes(data)
    raise AssertionError("no frame header found")


class CorruptSampleTestCase(unittest.TestCase):
    CONFIG = None

    def setUp(self):
        self.daemon = ferry_it.FerryDaemon(config=self.CONFIG)
        self.addCleanup(self.daemon.stop)
        self.root = ferry_it.make_image_folder(os.path.join(self.daemon.dir, "images"),
                                               {"cat": 12, "dog": 12})
        self.expected = ferry_it.expected_samples(self.root)
        with open(os.path.join(self.root, "cat", "3.jpg"), "rb") as f:
            self.good = f.read()

    def write(self, relative, data):
        path = os.path.join(self.root, relative)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def index_of(self, path):
        self.expected = ferry_it.expected_samples(self.root)
        return [p for p, _ in self.expected].index(path)

    def loader(self, **kwargs):
        args = dict(batch_size=4, transform=ferry.RandomResizedCrop(16, flip=True),
                    shuffle=True, seed=5, address=self.daemon.address, as_numpy=True,
                    timeout=30)
        args.update(kwargs)
        loader = ferry.Loader(ferry.ImageFolder(self.root), **args)
        self.addCleanup(loader.close)
        return loader

    def job_status(self, loader):
        return ferry_it.ferryctl(self.daemon.address, "job", loader.job["id"])


class SkipPolicyTest(CorruptSampleTestCase):
    def test_substitutes_are_deterministic_and_bad_files_are_not_read_again(self):
        truncated = self.write("cat/truncated.jpg", self.good[:len(self.good) // 2])
        not_jpeg = self.write("dog/notes.jpg", b"this is a text file, not a JPEG\n" * 20)
        huge = self.write("dog/huge.jpg", huge_header_jpeg(self.good))
        bad = {self.index_of(p): p for p in (truncated, not_jpeg, huge)}
        n = len(self.expected)
        self.assertEqual(n, 27)

        loader = self.loader(world_size=1, drop_last=False)
        loader.set_epoch(0)
        first = [b["index"].tolist() for b in loader]
        self.assertEqual(len(first), len(loader))
        flat = [i for b in first for i in b]
        self.assertEqual(len(flat), n)  # full size: every bad row got a substitute
        self.assertFalse(set(flat) & set(bad), "a bad sample was delivered")

        status = self.job_status(loader)
        self.assertEqual(int(status["errors"]), 3, status)
        self.assertEqual(int(status["quarantined"]), 3, status)
        self.assertGreaterEqual(int(status["substituted"]), 3, status)
        messages = {e["path"]: e["message"] for e in status["recent_errors"]}
        self.assertEqual(set(messages), set(bad.values()), status)
        self.assertIn("decode_limits.max_image_pixels", messages[huge])
        self.assertIn("cannot decode", messages[not_jpeg])

        # Quarantine: the truncated file is repaired on disk, yet it stays replaced (it is
        # never read again), by the same substitute as before.
        self.write("cat/truncated.jpg", self.good)
        loader.set_epoch(0)
        again = [b["index"].tolist() for b in loader]
        self.assertEqual(again, first)
        self.assertEqual(int(self.job_status(loader)["errors"]), 3)

        # ferryctl's table names the bad files too.
        table = ferry_it.run_ferryctl(self.daemon.address, "job", loader.job["id"]).stdout
        for path in bad.values():
            self.assertIn(path, table)
        self.assertIn("quarantined", table)

    def test_every_rank_gets_the_same_number_of_full_batches(self):
        for k in range(5):
            self.write("cat/bad%d.jpg" % k, self.good[:200])
        n = len(ferry_it.expected_samples(self.root))
        counts = []
        for rank in range(3):
            loader = self.loader(rank=rank, world_size=3, drop_last=True, job_name="ranks")
            loader.set_epoch(1)
            batches = [b["index"] for b in loader]
            self.assertTrue(all(len(b) == 4 for b in batches))
            counts.append(len(batches))
        self.assertEqual(counts, [n // 3 // 4] * 3)


class FailPolicyTest(CorruptSampleTestCase):
    def test_first_bad_sample_stops_the_job_naming_the_file(self):
        bad = self.write("dog/5.jpg", self.good[:300])
        loader = self.loader(on_corrupt_sample="fail", job_name="strict")
        loader.set_epoch(0)
        with self.assertRaises(ferry.FerryError) as cm:
            for _ in loader:
                pass
        self.assertEqual(cm.exception.code, "DATA_LOSS", cm.exception)
        self.assertIn(bad, cm.exception.message)
        self.assertIn("on_corrupt_sample", cm.exception.message)
        status = self.job_status(loader)
        self.assertIn(bad, status["failure"])

        # Fixed on disk, the same job spec starts afresh and runs clean.
        self.write("dog/5.jpg", self.good)
        loader2 = self.loader(on_corrupt_sample="fail", job_name="strict")
        loader2.set_epoch(0)
        self.assertEqual(sum(len(b["index"]) for b in loader2), len(self.expected))
        self.assertNotEqual(loader2.job["id"], loader.job["id"])
        # The daemon kept serving throughout.
        self.assertEqual(ferry_it.run_ferryctl(self.daemon.address, "status").returncode, 0)


class ConfiguredLimitsTest(CorruptSampleTestCase):
    # Every test image is 48 x 40 = 1920 pixels and under 2 KB; the big one is not.
    CONFIG = "decode_limits { max_image_pixels: 200000 max_sample_bytes: 30000 }\n"

    def test_limits_from_the_config_refuse_quickly(self):
        from PIL import Image
        import io
        import random
        rng = random.Random(1)
        noise = Image.frombytes("RGB", (600, 400), bytes(rng.getrandbits(8)
                                                         for _ in range(600 * 400 * 3)))
        out = io.BytesIO()
        noise.save(out, format="JPEG", quality=95)
        big = self.write("cat/big.jpg", out.getvalue())  # 240000 px, > 30000 bytes
        loader = self.loader()
        loader.set_epoch(0)
        start = time.monotonic()
        self.assertEqual(sum(len(b["index"]) for b in loader),
                         len(ferry_it.expected_samples(self.root)))
        self.assertLess(time.monotonic() - start, 20)
        status = self.job_status(loader)
        [error] = [e for e in status["recent_errors"] if e["path"] == big]
        self.assertIn("max_sample_bytes", error["message"])


if __name__ == "__main__":
    unittest.main()
