"""ferry.Blend: argument checks, and end to end against a private ferryd (skipped without a
ferryd binary) over a blend of an IndexedDataset, TokenShards and Tokens: index streams of
every rank for W = 1..8 equal to a pure-Python reference of the sampler and the blend
(testing/blend_reference.py), every row equal to its source's window, batch compositions
within statistical bounds of the weights, per-source counts in the job's status, and two
runs bit-identical."""

import collections
import math
import os
import tempfile
import unittest

import numpy as np

import ferry
from support import HAVE_FERRYD, open_loader  # sets sys.path for testing/ too
import blend_reference
import megatron_indexed


class BlendArgsTest(unittest.TestCase):
    def test_spec_nests_the_datasets(self):
        blend = ferry.Blend([ferry.Tokens("/a.bin", 4), ferry.IndexedDataset("/w", 4)],
                            weights=[3, 1.5], names=["a", "wiki"], samples_per_epoch=100)
        self.assertEqual(blend._spec(), {"blend": {"sources": [
            {"dataset": ferry.Tokens("/a.bin", 4)._spec(), "weight": 3.0, "name": "a"},
            {"dataset": ferry.IndexedDataset("/w", 4)._spec(), "weight": 1.5,
             "name": "wiki"}], "samples_per_epoch": "100"}})
        plain = ferry.Blend([ferry.Tokens("/a.bin", 4)], weights=[1])._spec()["blend"]
        self.assertEqual(plain, {"sources": [{"dataset": ferry.Tokens("/a.bin", 4)._spec(),
                                              "weight": 1.0}]})

    def test_bad_arguments(self):
        t = ferry.Tokens("/a.bin", 4)
        with self.assertRaises(TypeError):
            ferry.Blend([], weights=[])
        with self.assertRaises(TypeError):
            ferry.Blend([t, "x"], weights=[1, 1])
        with self.assertRaises(TypeError):
            ferry.Blend([ferry.Blend([t], weights=[1])], weights=[1])
        with self.assertRaisesRegex(ValueError, "one per dataset"):
            ferry.Blend([t, t], weights=[1])
        for bad in (0, -1, float("nan"), float("inf"), True, "1"):
            with self.assertRaisesRegex(ValueError, r"weights\[1\]"):
                ferry.Blend([t, t], weights=[1, bad])
        with self.assertRaisesRegex(ValueError, "names must differ"):
            ferry.Blend([t, t], weights=[1, 1], names=["a", "a"])
        with self.assertRaises(ValueError):
            ferry.Blend([t], weights=[1], samples_per_epoch=0)


def token_windows(tokens, seq_len):
    return [tokens[i * seq_len:i * seq_len + seq_len + 1]
            for i in range((len(tokens) - 1) // seq_len)]


@unittest.skipUnless(HAVE_FERRYD, "no ferryd binary (set FERRY_DAEMON)")
class BlendEndToEndTest(unittest.TestCase):
    SEQ_LEN = 6
    WEIGHTS = [0.5, 0.3, 0.2]

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        rng = np.random.default_rng(8)
        documents = [[list(rng.integers(0, 60000, size=rng.integers(1, 15)))]
                     for _ in range(30)]
        megatron_indexed.write_indexed(os.path.join(d, "wiki"), documents)
        n_wiki = (sum(len(s) for doc in documents for s in doc) - 1) // cls.SEQ_LEN
        wiki = [megatron_indexed.reference_sample(documents, cls.SEQ_LEN, i)[0]
                for i in range(n_wiki)]
        shards = []
        for i, n in enumerate((40, 27)):
            tokens = rng.integers(0, 2**16, size=n, dtype=np.uint16)
            tokens.astype("<u2").tofile(os.path.join(d, "web-%d.bin" % i))
            shards.append(tokens.astype(np.int64))
        web = [w for s in shards for w in token_windows(s, cls.SEQ_LEN)]
        code = rng.integers(0, 2**16, size=90, dtype=np.uint16)
        code.astype("<u2").tofile(os.path.join(d, "code.bin"))
        code_windows = token_windows(code.astype(np.int64), cls.SEQ_LEN)
        cls.sources = [ferry.IndexedDataset(os.path.join(d, "wiki"), cls.SEQ_LEN),
                       ferry.TokenShards(os.path.join(d, "web-{0..1}.bin"), cls.SEQ_LEN),
                       ferry.Tokens(os.path.join(d, "code.bin"), cls.SEQ_LEN)]
        cls.windows = [list(map(int, w)) for w in wiki + web + code_windows]
        cls.sizes = [len(wiki), len(web), len(code_windows)]
        os.environ.pop("FERRY_ADDRESS", None)
        os.environ["XDG_RUNTIME_DIR"] = d

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def blend(self, samples_per_epoch=None):
        return ferry.Blend(self.sources, weights=self.WEIGHTS, names=["wiki", "web", "code"],
                           samples_per_epoch=samples_per_epoch)

    def loader(self, dataset, batch_size=5, **kwargs):
        return open_loader(self, dataset, batch_size, **kwargs)

    def epoch(self, loader, epoch):
        loader.set_epoch(epoch)
        batches = []
        for batch in loader:
            self.assertEqual(batch["tokens"].shape, (len(batch["index"]), self.SEQ_LEN + 1))
            for row, i in zip(batch["tokens"], batch["index"]):
                self.assertEqual(list(map(int, row)), self.windows[i], "sample %d" % i)
            batches.append([int(i) for i in batch["index"]])
        return batches

    def test_every_rank_streams_the_reference_order(self):
        ref = blend_reference.Blend(self.sizes, self.WEIGHTS)
        self.assertEqual(len(ref), sum(self.sizes))
        for world in range(1, 9):
            for shuffle in (True, False):
                for rank in range(world):
                    loader = self.loader(self.blend(), rank=rank, world_size=world,
                                         shuffle=shuffle, seed=7,
                                         job_name="blend-w%d-%d" % (world, shuffle))
                    for epoch in (0, 1):
                        want = [[ref.index_at(7, epoch, shuffle, p) for p in batch]
                                for batch in blend_reference.rank_batches(
                                    len(ref), 5, world, rank, 7, epoch, shuffle)]
                        self.assertEqual(self.epoch(loader, epoch), want,
                                         "world %d rank %d shuffle %s epoch %d"
                                         % (world, rank, shuffle, epoch))

    def test_batches_follow_the_weights_and_status_counts_them(self):
        n, batch_size = 2000, 100
        loader = self.loader(self.blend(n), batch_size=batch_size, shuffle=True, seed=3)
        self.assertEqual(loader.job["samples_per_epoch"], str(n))
        offsets = np.cumsum([0] + self.sizes)
        totals = collections.Counter()
        for batch in self.epoch(loader, 0):
            counts = collections.Counter(int(np.searchsorted(offsets, i, side="right")) - 1
                                         for i in batch)
            totals.update(counts)
            for s, w in enumerate(self.WEIGHTS):
                # A batch is a draw without replacement from the epoch's positions.
                sigma = math.sqrt(batch_size * w * (1 - w) * (n - batch_size) / (n - 1))
                self.assertLess(abs(counts[s] - batch_size * w), 5 * sigma,
                                "source %d: %d of %d" % (s, counts[s], batch_size))
        self.assertEqual([totals[s] for s in range(3)], [1000, 600, 400])
        status = loader.job_status()
        sources = status["blend_sources"]
        self.assertEqual([s["name"] for s in sources], ["wiki", "web", "code"])
        self.assertEqual([int(s["samples_per_epoch"]) for s in sources], [1000, 600, 400])
        self.assertEqual([int(s["num_samples"]) for s in sources], self.sizes)
        for s, want in zip(sources, [1000, 600, 400]):
            self.assertGreaterEqual(int(s["samples_drawn"]), want)

    def test_two_runs_are_bit_identical(self):
        runs = []
        for name in ("blend-run-a", "blend-run-b"):
            loader = self.loader(self.blend(300), shuffle=True, seed=11, job_name=name)
            loader.set_epoch(4)
            runs.append([{k: v.tobytes() for k, v in batch.items()} for batch in loader])
        self.assertNotEqual(runs[0][0]["index"], runs[0][1]["index"])
        self.assertEqual(runs[0], runs[1])

    def test_sources_with_other_fields_are_refused_by_name(self):
        other = ferry.Tokens(os.path.join(self.tmp.name, "code.bin"), self.SEQ_LEN + 1)
        with self.assertRaises(ferry.FerryError) as caught:
            self.loader(ferry.Blend([self.sources[0], other], weights=[1, 1],
                                    names=["wiki", "longer"]))
        self.assertIn("must deliver the same fields", str(caught.exception))
        self.assertIn("'longer' has tokens INT64[8]", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
