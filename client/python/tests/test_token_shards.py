"""ferry.TokenShards: argument checks, and end to end against a private ferryd (FERRY_DAEMON
or the build tree; skipped when no ferryd binary can be found): every row against a
pure-Python reference of the windows, exact index streams without shuffle, equal per-rank
counts for W = 1..8 with shuffle."""

import collections
import math
import os
import tempfile
import unittest

import numpy as np

import ferry
from support import HAVE_FERRYD, open_loader

def reference_windows(shards, seq_len, cross_files):
    """The samples of a token_shards dataset, in index order (docs/data.md)."""
    if cross_files:
        stream = np.concatenate(shards)
        return [stream[i * seq_len:i * seq_len + seq_len + 1]
                for i in range((len(stream) - 1) // seq_len)]
    return [shard[j * seq_len:j * seq_len + seq_len + 1]
            for shard in shards for j in range(max(len(shard) - 1, 0) // seq_len)]


def reference_rank_indices(n, world, rank):
    """torch's DistributedSampler without shuffle or drop_last: the order padded by
    repeating its head, rank r takes positions r, r + W, ..."""
    order = list(range(n))
    padded = math.ceil(n / world) * world
    order += order[:padded - n]
    return order[rank::world]


class TokenShardsArgsTest(unittest.TestCase):
    def test_spec_uses_proto_field_names(self):
        spec = ferry.TokenShards("rel-{0..3}.bin", 128, dtype="uint32",
                                 windows_cross_files=True)._spec()
        self.assertEqual(spec, {"token_shards": {
            "shards": [os.path.abspath("rel-{0..3}.bin")], "seq_len": 128,
            "token_dtype": "UINT32", "output_dtype": "INT64", "windows_cross_files": True}})
        spec = ferry.TokenShards(["/a.bin", "/b.bin"], 4, output_dtype="int32")._spec()
        self.assertEqual(spec["token_shards"]["shards"], ["/a.bin", "/b.bin"])
        self.assertNotIn("windows_cross_files", spec["token_shards"])

    def test_bad_arguments(self):
        with self.assertRaises(TypeError):
            ferry.TokenShards([], 4)
        with self.assertRaises(TypeError):
            ferry.TokenShards([3], 4)
        with self.assertRaises(ValueError):
            ferry.TokenShards([""], 4)
        with self.assertRaises(ValueError):
            ferry.TokenShards("/a.bin", 0)
        with self.assertRaisesRegex(ValueError, "dtype must be one of"):
            ferry.TokenShards("/a.bin", 4, dtype="int16")
        with self.assertRaisesRegex(ValueError, "output_dtype must be one of"):
            ferry.TokenShards("/a.bin", 4, output_dtype="uint8")
        with self.assertRaises(TypeError):
            ferry.TokenShards("/a.bin", 4, windows_cross_files=1)


@unittest.skipUnless(HAVE_FERRYD, "no ferryd binary (set FERRY_DAEMON)")
class TokenShardsEndToEndTest(unittest.TestCase):
    SEQ_LEN = 5
    LENGTHS = (23, 4, 61, 0, 17, 6)  # a shard too short for a window, an empty one

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        rng = np.random.default_rng(3)
        cls.shards = []
        for i, n in enumerate(cls.LENGTHS):
            tokens = rng.integers(0, 2**16, size=n, dtype=np.uint16)
            tokens.astype("<u2").tofile(os.path.join(cls.tmp.name, "train-%03d.bin" % i))
            cls.shards.append(tokens.astype(np.int64))
        cls.pattern = os.path.join(cls.tmp.name, "train-{000..%03d}.bin" % (len(cls.LENGTHS) - 1))
        os.environ.pop("FERRY_ADDRESS", None)
        os.environ["XDG_RUNTIME_DIR"] = cls.tmp.name

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def loader(self, dataset, batch_size=4, **kwargs):
        return open_loader(self, dataset, batch_size, **kwargs)

    def epoch(self, loader, windows, epoch=0):
        loader.set_epoch(epoch)
        seen = []
        for batch in loader:
            tokens, index = batch["tokens"], batch["index"]
            self.assertEqual(tokens.dtype, np.int64)
            self.assertEqual(tokens.shape, (len(index), self.SEQ_LEN + 1))
            for row, i in zip(tokens, index):
                np.testing.assert_array_equal(row, windows[i], err_msg="sample %d" % i)
            seen.extend(int(i) for i in index)
        return seen

    def test_exact_index_streams_without_shuffle(self):
        for cross in (False, True):
            windows = reference_windows(self.shards, self.SEQ_LEN, cross)
            self.assertEqual(len(windows), 4 + 0 + 12 + 3 + 1 if not cross else 110 // 5)
            dataset = ferry.TokenShards(self.pattern, self.SEQ_LEN, windows_cross_files=cross)
            for rank in range(3):
                loader = self.loader(dataset, rank=rank, world_size=3,
                                     job_name="shards-plain-%d" % cross)
                self.assertEqual(self.epoch(loader, windows),
                                 reference_rank_indices(len(windows), 3, rank))

    def test_equal_counts_for_one_to_eight_ranks_shuffled(self):
        windows = reference_windows(self.shards, self.SEQ_LEN, False)
        n = len(windows)
        dataset = ferry.TokenShards(self.pattern, self.SEQ_LEN)
        for world in range(1, 9):
            per_rank = []
            for rank in range(world):
                loader = self.loader(dataset, rank=rank, world_size=world, shuffle=True,
                                     seed=5, job_name="shards-w%d" % world)
                per_rank.append(self.epoch(loader, windows))
            self.assertEqual([len(s) for s in per_rank],
                             [math.ceil(n / world)] * world, "world %d" % world)
            counts = collections.Counter(i for s in per_rank for i in s)
            self.assertEqual(set(counts), set(range(n)), "world %d" % world)
            if world == 1:
                self.assertNotEqual(per_rank[0], sorted(per_rank[0]))  # shuffled

    def test_bad_shard_is_named(self):
        odd = os.path.join(self.tmp.name, "odd.bin")
        with open(odd, "wb") as f:
            f.write(b"\x01\x00\x02")
        with self.assertRaises(ferry.FerryError) as caught:
            loader = self.loader(ferry.TokenShards(odd, 1))
            next(iter(loader))
        self.assertIn("token shard '%s' is 3 bytes, not a multiple of 2" % odd,
                      str(caught.exception))


if __name__ == "__main__":
    unittest.main()
