"""ferry.WebDataset: argument checks, and end to end against a private ferryd (FERRY_DAEMON or
the build tree; skipped when no ferryd binary can be found)."""

import io
import json
import os
import tarfile
import tempfile
import unittest

import numpy as np

import ferry
from support import HAVE_FERRYD


try:
    from PIL import Image
except ImportError:
    Image = None

SHARDS = 6
PER_SHARD = 20


def jpeg_bytes(rng, width, height, label, **save_args):
    """A small JPEG whose red channel encodes the label, with some noise."""
    pixels = rng.integers(0, 60, size=(height, width, 3), dtype=np.uint8)
    pixels[..., 0] += np.uint8(20 * (label % 10))
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=90, **save_args)
    return out.getvalue()


def add_member(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1700000000
    tar.addfile(info, io.BytesIO(data))


class WebDatasetArgsTest(unittest.TestCase):
    def test_spec_and_absolute_patterns(self):
        spec = ferry.WebDataset("data/shard-{000..009}.tar")._spec()
        self.assertEqual(spec, {"webdataset": {
            "shards": [os.path.join(os.getcwd(), "data", "shard-{000..009}.tar")],
            "image_key": "jpg", "label_key": "cls", "shuffle_buffer": 1000}})
        # Only the directory before the first brace is resolved; the groups stay as written.
        ds = ferry.WebDataset(["/d/../e/{a,b/../c}.tar", "x-{0..1}.tar", "{a,b}/y.tar"],
                              image_key="png", label_key="txt", shuffle_buffer=7)
        self.assertEqual(ds.shards, ["/e/{a,b/../c}.tar",
                                     os.path.join(os.getcwd(), "x-{0..1}.tar"),
                                     os.path.join(os.getcwd(), "{a,b}/y.tar")])
        self.assertEqual(ds._spec()["webdataset"]["shuffle_buffer"], 7)
        self.assertIn("WebDataset", repr(ds))

    def test_bad_arguments(self):
        with self.assertRaises(TypeError):
            ferry.WebDataset([])
        with self.assertRaises(TypeError):
            ferry.WebDataset(3)
        with self.assertRaises(TypeError):
            ferry.WebDataset(["/a.tar", 3])
        with self.assertRaises(ValueError):
            ferry.WebDataset([""])
        with self.assertRaisesRegex(ValueError, "image_key"):
            ferry.WebDataset("/a.tar", image_key="")
        with self.assertRaisesRegex(ValueError, "label_key"):
            ferry.WebDataset("/a.tar", label_key=".")
        with self.assertRaisesRegex(ValueError, "shuffle_buffer must be >= 1"):
            ferry.WebDataset("/a.tar", shuffle_buffer=0)
        with self.assertRaisesRegex(ValueError, "needs a transform"):
            ferry.Loader(ferry.WebDataset("/a.tar"), batch_size=2)
        with self.assertRaisesRegex(TypeError, "shards or shard_index .* got both"):
            ferry.WebDataset("/a.tar", shard_index="/i.json")
        with self.assertRaisesRegex(TypeError, "got neither"):
            ferry.WebDataset()
        with self.assertRaisesRegex(ValueError, "shard_index must not be empty"):
            ferry.WebDataset(shard_index="")

    def test_shard_index_spec(self):
        spec = ferry.WebDataset(shard_index="data/index.json", shuffle_buffer=5)._spec()
        self.assertEqual(spec, {"webdataset": {
            "shard_index": os.path.join(os.getcwd(), "data", "index.json"),
            "image_key": "jpg", "label_key": "cls", "shuffle_buffer": 5}})
        remote = ferry.WebDataset(shard_index="s3://bucket/train/index.json")
        self.assertEqual(remote._spec()["webdataset"]["shard_index"],
                         "s3://bucket/train/index.json")
        self.assertIn("shard_index='s3://bucket/train/index.json'", repr(remote))


@unittest.skipUnless(HAVE_FERRYD, "no ferryd binary (set FERRY_DAEMON)")
@unittest.skipUnless(Image is not None, "PIL is not installed")
class WebDatasetEndToEndTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.saved_env = {k: os.environ.get(k) for k in ("FERRY_ADDRESS", "XDG_RUNTIME_DIR")}
        os.environ.pop("FERRY_ADDRESS", None)
        # The Loaders below must start a private daemon rather than find a real one.
        os.environ["XDG_RUNTIME_DIR"] = cls.tmp.name
        cls.dir = os.path.join(cls.tmp.name, "wds")
        os.makedirs(cls.dir)
        cls.pattern = os.path.join(cls.dir, "shard-{000000..%06d}.tar" % (SHARDS - 1))
        cls.write_dataset()

    @classmethod
    def tearDownClass(cls):
        for key, value in cls.saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        cls.tmp.cleanup()

    @classmethod
    def write_dataset(cls):
        """SHARDS shards of PER_SHARD samples. Sample numbers follow shard order then member
        order, counting only samples with an image member. Bad samples: two corrupt JPEGs,
        a truncated one, one that is not a JPEG, one with a non-numeric label."""
        rng = np.random.default_rng(1234)
        cls.labels = []       # per sample index: the .cls value (-1 without one)
        cls.paths = []        # per sample index: "<shard>:<image member>"
        cls.bad = set()       # sample indices that cannot be read
        cls.shard_of = []     # per sample index: shard number
        bad_plan = {(0, 3): "corrupt", (1, 17): "truncated", (2, 8): "not-jpeg",
                    (4, 0): "corrupt", (5, 11): "label"}
        for s in range(SHARDS):
            path = os.path.join(cls.dir, "shard-%06d.tar" % s)
            with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
                for i in range(PER_SHARD):
                    key = "n%02d_%04d" % (s, i)
                    label = int(rng.integers(0, 10))
                    image = jpeg_bytes(rng, int(rng.integers(40, 72)), int(rng.integers(40, 72)),
                                       label)
                    kind = bad_plan.get((s, i))
                    cls_text = b"%d\n" % label
                    if kind == "corrupt":
                        image = image[:30] + bytes(rng.integers(0, 256, 400, dtype=np.uint8))
                    elif kind == "truncated":
                        # Cut just after the start of the scan: no MCU survives, whatever
                        # region the crop decodes.
                        image = image[:image.index(b"\xff\xda") + 16]
                    elif kind == "not-jpeg":
                        image = b"GIF89a this is not a JPEG at all"
                    elif kind == "label":
                        cls_text = b"dog\n"
                    if s == 3 and i == 5:
                        # A sample without a label: served with label -1.
                        add_member(tar, key + ".jpg", image)
                        label = -1
                    elif s == 3 and i == 6:
                        # A sample without an image: not a sample at all.
                        add_member(tar, key + ".cls", cls_text)
                        continue
                    else:
                        add_member(tar, key + ".cls", cls_text)
                        add_member(tar, key + ".jpg", image)
                        add_member(tar, key + ".json", b'{"source": "test"}')
                    if kind is not None:
                        cls.bad.add(len(cls.labels))
                    cls.labels.append(label)
                    cls.paths.append("%s:%s.jpg" % (path, key))
                    cls.shard_of.append(s)
        cls.n = len(cls.labels)
        cls.good = set(range(cls.n)) - cls.bad

    def loaders(self, job_name, seed=17, shuffle=True, dataset=None, batch_size=8):
        dataset = dataset or ferry.WebDataset(self.pattern)
        out = []
        for rank in range(2):
            loader = ferry.Loader(dataset, batch_size=batch_size,
                                  transform=ferry.RandomResizedCrop(32), shuffle=shuffle,
                                  seed=seed, rank=rank, world_size=2, job_name=job_name,
                                  as_numpy=True, timeout=60)
            self.addCleanup(loader.close)
            out.append(loader)
        self.assertEqual(out[0].job["id"], out[1].job["id"])
        return out

    def run_epoch(self, loaders, epoch):
        """[(indices, labels, images) per rank] of one epoch."""
        result = []
        for loader in loaders:
            loader.set_epoch(epoch)
            batches = list(loader)
            self.assertEqual(len(batches), len(loader))
            for b in batches:
                self.assertEqual(b["image"].dtype, np.uint8)
                self.assertEqual(b["image"].shape[1:], (32, 32, 3))
            result.append((np.concatenate([b["index"] for b in batches]).tolist(),
                           np.concatenate([b["label"] for b in batches]).tolist(),
                           np.concatenate([b["image"] for b in batches])))
        return result

    def test_two_epochs_two_ranks(self):
        loaders = self.loaders("wds-main")
        per_rank = (self.n + 1) // 2
        self.assertEqual(len(loaders[0]), (per_rank + 7) // 8)
        self.assertEqual(len(loaders[0]), len(loaders[1]))
        self.assertEqual(int(loaders[0].job["num_samples"]), self.n)

        epochs = [self.run_epoch(loaders, e) for e in (0, 1)]
        for e, ranks in enumerate(epochs):
            self.assertEqual(len(ranks[0][0]), len(ranks[1][0]), "epoch %d" % e)
            self.assertEqual(len(ranks[0][0]), per_rank)
            seen = set()
            for indices, labels, images in ranks:
                seen.update(indices)
                # Bad samples are never delivered: a deterministic substitute takes their row.
                self.assertFalse(set(indices) & self.bad, "epoch %d" % e)
                for index, label in zip(indices, labels):
                    self.assertEqual(label, self.labels[index], "sample %d" % index)
                self.assertGreater(int(images.astype(np.int64).sum()), 0)
            self.assertTrue(self.good <= seen, "epoch %d misses %s" % (e, self.good - seen))
        # Different epochs, different order.
        self.assertNotEqual(epochs[0][0][0], epochs[1][0][0])

        # Every bad sample is reported once, by "<shard>:<member>".
        client = ferry.Client(loaders[0].address)
        self.addCleanup(client.close)
        job = client.get_job(loaders[0].job["id"])
        self.assertEqual(int(job.get("errors", 0)), len(self.bad))
        self.assertEqual(int(job.get("quarantined", 0)), len(self.bad))
        self.assertGreater(int(job.get("substituted", 0)), 0)
        reported = {e["path"]: e for e in job.get("recent_errors", [])}
        self.assertEqual(set(reported), {self.paths[i] for i in self.bad})
        for i in self.bad:
            self.assertEqual(int(reported[self.paths[i]]["index"]), i)
        label_error = [e for p, e in reported.items() if p.endswith("n05_0011.jpg")][0]
        self.assertIn("n05_0011.cls' is not a decimal integer label", label_error["message"])
        status_jobs = client.status().get("jobs", [])
        self.assertIn(loaders[0].job["id"], [j["job"]["id"] for j in status_jobs])

        # A second run with the same (seed, epoch), as a fresh job: same indices and pixels.
        again = self.loaders("wds-again")
        for e in (0, 1):
            rerun = self.run_epoch(again, e)
            for rank in range(2):
                self.assertEqual(rerun[rank][0], epochs[e][rank][0], "epoch %d rank %d" % (e, rank))
                np.testing.assert_array_equal(rerun[rank][2], epochs[e][rank][2])

    def write_index(self, name, counts):
        """A shard index as `widsindex create` writes it, shard URLs relative to it."""
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            json.dump({"__kind__": "wids-shard-index-v1", "wids_version": 1,
                       "shardlist": [{"url": "shard-%06d.tar" % s, "nsamples": n,
                                      "filesize": os.path.getsize(
                                          os.path.join(self.dir, "shard-%06d.tar" % s))}
                                     for s, n in enumerate(counts)]}, f)
        return path

    def test_shard_index_numbers_every_member_group(self):
        # With the index, samples are numbered as WebDataset groups members: shard 3's
        # sample without an image is sample 66, and a bad sample.
        index = self.write_index("index.json", [PER_SHARD] * SHARDS)
        loaders = self.loaders("wds-index", dataset=ferry.WebDataset(shard_index=index))
        self.assertEqual(int(loaders[0].job["num_samples"]), SHARDS * PER_SHARD)
        imageless = 3 * PER_SHARD + 6

        def indexed(i):  # the sample's number without the index
            s, k = divmod(i, PER_SHARD)
            return i - (1 if (s, k) > (3, 6) else 0)

        bad = {i for i in range(SHARDS * PER_SHARD)
               if i == imageless or indexed(i) in self.bad}
        seen = set()
        for indices, labels, _ in self.run_epoch(loaders, 0):
            self.assertFalse(set(indices) & bad)
            for index, label in zip(indices, labels):
                self.assertEqual(label, self.labels[indexed(index)], "sample %d" % index)
            seen.update(indices)
        self.assertEqual(seen, set(range(SHARDS * PER_SHARD)) - bad)
        client = ferry.Client(loaders[0].address)
        self.addCleanup(client.close)
        job = client.get_job(loaders[0].job["id"])
        self.assertEqual(int(job.get("quarantined", 0)), len(bad))
        messages = [e["message"] for e in job.get("recent_errors", [])]
        self.assertTrue(any("n03_0006' has no 'jpg' member" in m for m in messages), messages)

    def test_a_shard_index_of_other_counts_stops_the_job(self):
        index = self.write_index("stale.json", [PER_SHARD] * 2 + [PER_SHARD + 1] +
                                 [PER_SHARD] * (SHARDS - 3))
        loaders = self.loaders("wds-stale", shuffle=False,
                               dataset=ferry.WebDataset(shard_index=index))
        with self.assertRaises(ferry.FerryError) as cm:
            for loader in loaders:
                list(loader)
        self.assertIn("shard-000002.tar' holds 20 samples", cm.exception.message)
        self.assertIn("Make the index again", cm.exception.message)

    def test_ranks_read_contiguous_runs_of_whole_shards(self):
        # No shuffle buffer: the order is the shards permuted, each shard's samples in order,
        # and each rank takes a contiguous half of it.
        dataset = ferry.WebDataset(self.pattern, shuffle_buffer=1)
        orders = []
        for epoch in (0, 1):
            loaders = self.loaders("wds-runs", dataset=dataset)
            ranks = self.run_epoch(loaders, epoch)
            for loader in loaders:
                loader.close()
            stream = ranks[0][0] + ranks[1][0]
            # Outside bad samples' substitutes, consecutive samples come from one shard, in
            # member order, so the shard changes only at shard boundaries.
            clean = [i for i in stream if i not in self.bad]
            shard_runs = [self.shard_of[clean[0]]]
            for cur in clean[1:]:
                if self.shard_of[cur] != shard_runs[-1]:
                    shard_runs.append(self.shard_of[cur])
            positions_ok = sum(1 for prev, cur in zip(clean, clean[1:]) if cur == prev + 1 or
                               self.shard_of[cur] != self.shard_of[prev])
            self.assertGreaterEqual(positions_ok, len(clean) - 1 - 2 * len(self.bad))
            # (+ 1: the odd sample count pads the last rank with the head of the order.)
            self.assertLessEqual(len(shard_runs), SHARDS + 2 * len(self.bad) + 1)
            orders.append(shard_runs)
            # The first rank's run starts with the first sample of a shard.
            first = self.shard_of.index(self.shard_of[stream[0]])
            if first not in self.bad:
                self.assertEqual(stream[0], first)
        self.assertNotEqual(orders[0], orders[1])


if __name__ == "__main__":
    unittest.main()
