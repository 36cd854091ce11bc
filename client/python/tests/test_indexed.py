"""ferry.IndexedDataset (Megatron-LM .bin + .idx): argument checks, and end to end against a
private ferryd (skipped without a ferryd binary): every row of tokens, position_ids and
cu_seqlens against a pure-Python reference (testing/megatron_indexed.py), exact index
streams without shuffle, equal per-rank counts for W = 1..8, a corrupt .idx refused."""

import math
import os
import tempfile
import unittest

import numpy as np

import ferry
from support import HAVE_FERRYD, open_loader  # sets sys.path for testing/ too
import megatron_indexed


class IndexedArgsTest(unittest.TestCase):
    def test_spec_uses_proto_field_names(self):
        spec = ferry.IndexedDataset("/d/wiki_text_document", 2048, position_ids=True,
                                    cu_seqlens=True)._spec()
        self.assertEqual(spec, {"indexed": {
            "path_prefix": "/d/wiki_text_document", "seq_len": 2048, "output_dtype": "INT64",
            "position_ids": True, "cu_seqlens": True}})
        self.assertEqual(ferry.IndexedDataset("/d/x", 4)._spec()["indexed"],
                         {"path_prefix": "/d/x", "seq_len": 4, "output_dtype": "INT64"})

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "without .idx"):
            ferry.IndexedDataset("/d/x.idx", 4)
        with self.assertRaises(ValueError):
            ferry.IndexedDataset("/d/x", 0)
        with self.assertRaises(ValueError):
            ferry.IndexedDataset("/d/x", 4, output_dtype="uint16")
        with self.assertRaises(TypeError):
            ferry.IndexedDataset("/d/x", 4, cu_seqlens="yes")


@unittest.skipUnless(HAVE_FERRYD, "no ferryd binary (set FERRY_DAEMON)")
class IndexedEndToEndTest(unittest.TestCase):
    SEQ_LEN = 8

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        rng = np.random.default_rng(21)
        cls.documents = []
        for _ in range(40):  # documents of 1..3 sequences of 1..12 tokens
            cls.documents.append([list(rng.integers(0, 50000, size=rng.integers(1, 13)))
                                  for _ in range(rng.integers(1, 4))])
        cls.prefix = os.path.join(cls.tmp.name, "corpus_text_document")
        megatron_indexed.write_indexed(cls.prefix, cls.documents)
        total = sum(len(s) for d in cls.documents for s in d)
        cls.n = (total - 1) // cls.SEQ_LEN
        os.environ.pop("FERRY_ADDRESS", None)
        os.environ["XDG_RUNTIME_DIR"] = cls.tmp.name

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def loader(self, dataset, batch_size=3, **kwargs):
        return open_loader(self, dataset, batch_size, **kwargs)

    def epoch(self, loader):
        seen = []
        for batch in loader:
            self.assertEqual(batch["cu_seqlens"].dtype, np.int32)
            self.assertEqual(batch["position_ids"].shape, batch["tokens"].shape)
            for b, i in enumerate(batch["index"]):
                tokens, positions, cu, num_seqs = megatron_indexed.reference_sample(
                    self.documents, self.SEQ_LEN, int(i))
                np.testing.assert_array_equal(batch["tokens"][b], tokens, "sample %d" % i)
                np.testing.assert_array_equal(batch["position_ids"][b], positions)
                np.testing.assert_array_equal(batch["cu_seqlens"][b], cu)
                self.assertEqual(batch["num_seqs"][b], num_seqs)
            seen.extend(int(i) for i in batch["index"])
        return seen

    def dataset(self):
        return ferry.IndexedDataset(self.prefix, self.SEQ_LEN, position_ids=True,
                                    cu_seqlens=True)

    def test_exact_index_streams_without_shuffle(self):
        for rank in range(2):
            seen = self.epoch(self.loader(self.dataset(), rank=rank, world_size=2,
                                          job_name="indexed-plain"))
            order = list(range(self.n))
            order += order[:math.ceil(self.n / 2) * 2 - self.n]
            self.assertEqual(seen, order[rank::2])

    def test_equal_counts_for_one_to_eight_ranks_shuffled(self):
        for world in range(1, 9):
            per_rank = [self.epoch(self.loader(self.dataset(), rank=r, world_size=world,
                                               shuffle=True, seed=3,
                                               job_name="indexed-w%d" % world))
                        for r in range(world)]
            self.assertEqual([len(s) for s in per_rank],
                             [math.ceil(self.n / world)] * world)
            self.assertEqual(set(i for s in per_rank for i in s), set(range(self.n)))

    def test_corrupt_index_is_named(self):
        prefix = os.path.join(self.tmp.name, "bad")
        megatron_indexed.write_indexed(prefix, [[[1, 2, 3]], [[4, 5, 6, 7]]])
        with open(prefix + ".idx", "r+b") as f:
            f.seek(9)
            f.write(b"\x02")  # version 2
        with self.assertRaises(ferry.FerryError) as caught:
            next(iter(self.loader(ferry.IndexedDataset(prefix, 2))))
        self.assertIn("Megatron index '%s.idx' has version 2" % prefix, str(caught.exception))


if __name__ == "__main__":
    unittest.main()
