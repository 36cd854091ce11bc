"""The megatron_gpt dataset through ferryd: the ranks of a run get Megatron-Core's samples
(testing/megatron_core/references: what Megatron-Core's own GPTDataset and BlendedDataset
yielded for the same corpora, split, seed and sizes) dealt as Megatron's
MegatronPretrainingSampler deals them; a state saved mid-epoch resumes on the same and on
another world size with every sample once; a shuffled job is refused."""

import collections
import os
import unittest

import numpy as np

import ferry
import ferry_it

REFERENCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "testing",
                          "megatron_core", "references")
FIELDS = ("tokens", "labels", "loss_mask", "position_ids", "attention_mask")


def reference(case, split="train"):
    with np.load(os.path.join(REFERENCES, case + ".npz")) as npz:
        return {f: npz["%s/%s" % (split, f)] for f in FIELDS}


def corpus(name):
    return os.path.join(REFERENCES, "corpora", name)


# Megatron's configuration of each reference case (manifest.json): tokenizer eod 2, pad 1,
# seed 1234, sequence_length 8, create_attention_mask on.
def one_corpus():
    return ferry.MegatronGPT(corpus("one_seq_per_doc"), 8, eod_token=2, pad_token=1,
                             split="1,0,0", num_samples=20, create_attention_mask=True)


def blend3(split_name="train", num_samples=40):
    return ferry.MegatronGPT([corpus("blend_src%d" % d) for d in range(3)], 8, eod_token=2,
                             pad_token=1, weights=[0.7, 0.2, 0.1], split="90,10,0",
                             split_name=split_name, num_samples=num_samples,
                             create_attention_mask=True)


def megatron_deal(n, world_size, micro_batch, drop_last=True):
    """MegatronPretrainingSampler(total_samples=n, consumed_samples=0, micro_batch_size,
    data_parallel_rank=r, data_parallel_size=world_size, drop_last) for each rank, as its
    __iter__ is written: the indices of each micro-batch."""
    out = [[] for _ in range(world_size)]
    batch = []
    for idx in range(n):
        batch.append(idx)
        if len(batch) == micro_batch * world_size:
            for r in range(world_size):
                out[r].append(batch[r * micro_batch:(r + 1) * micro_batch])
            batch = []
    if batch and not drop_last:
        raise AssertionError("only drop_last deals are compared with Megatron's")
    return out


class MegatronGptTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = ferry_it.FerryDaemon()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def loaders(self, dataset, world_size, batch_size, drop_last=True):
        out = []
        for rank in range(world_size):
            loader = ferry.Loader(dataset, batch_size=batch_size, drop_last=drop_last, rank=rank,
                                  world_size=world_size, address=self.daemon.address,
                                  as_numpy=True, prefetch=2, timeout=30)
            self.addCleanup(loader.close)
            out.append(loader)
        return out

    def assert_rows(self, batch, ref, indices, what):
        self.assertEqual([int(i) for i in batch["index"]], list(indices), what)
        for f in FIELDS:
            want = ref[f][list(indices)]
            self.assertEqual(batch[f].dtype, want.dtype, "%s %s" % (what, f))
            np.testing.assert_array_equal(batch[f], want, "%s %s" % (what, f))

    def test_the_ranks_get_megatrons_micro_batches(self):
        for name, dataset, case, split, world_size, micro in (
                ("one corpus", one_corpus(), "a_one_seq_per_doc", "train", 2, 3),
                ("blend of 3", blend3(), "g1_blend3", "train", 3, 2),
                ("blend valid split", blend3("valid", 8), "g1_blend3", "valid", 2, 2)):
            with self.subTest(name):
                ref = reference(case, split)
                n = len(ref["tokens"])
                deal = megatron_deal(n, world_size, micro)
                for rank, loader in enumerate(self.loaders(dataset, world_size, micro)):
                    batches = list(loader)
                    self.assertEqual(len(batches), len(deal[rank]), "%s rank %d" % (name, rank))
                    for k, (batch, indices) in enumerate(zip(batches, deal[rank])):
                        self.assert_rows(batch, ref, indices,
                                         "%s rank %d batch %d" % (name, rank, k))
                    loader.close()

    def test_a_shuffled_job_is_refused(self):
        with self.assertRaises(ferry.FerryError) as raised:
            loader = ferry.Loader(one_corpus(), batch_size=2, shuffle=True,
                                  address=self.daemon.address, as_numpy=True, timeout=30)
            self.addCleanup(loader.close)
            next(iter(loader))
        self.assertIn("shuffle", str(raised.exception))

    def take(self, loaders, count=None):
        got = []
        for loader in loaders:
            it = iter(loader)
            rows = []
            while count is None or len(rows) < count:
                batch = next(it, None)
                if batch is None:
                    break
                rows.append(batch)
            got.append(rows)
        return got

    def test_a_state_resumes_mid_epoch_on_the_same_and_another_world_size(self):
        ref = reference("g1_blend3")
        n = len(ref["tokens"])  # 43: the sources' ceil(40 * w) targets
        for then in ((2, 2), (3, 1), (1, 5)):
            with self.subTest(then=then):
                first = self.loaders(blend3(), 2, 2, drop_last=False)
                part1 = self.take(first, 3)  # 12 samples: Megatron's consumed_samples
                state = first[0].state_dict()
                self.assertEqual(state, first[1].state_dict())
                for loader in first:
                    loader.close()
                second = self.loaders(blend3(), then[0], then[1], drop_last=False)
                for loader in second:
                    loader.load_state_dict(state)
                part2 = self.take(second)
                for loader in second:
                    loader.close()
                if then == (2, 2):
                    # The same shape continues Megatron's own deal from consumed_samples 12
                    # (its full global batches; the short last one is padded).
                    deal = megatron_deal(n, 2, 2)
                    for rank in range(2):
                        self.assertEqual(len(part2[rank]), len(deal[rank]) - 3 + 1)
                        for k, batch in enumerate(part2[rank][:-1]):
                            self.assert_rows(batch, ref, deal[rank][3 + k],
                                             "resumed rank %d batch %d" % (rank, k))
                seen = collections.Counter()
                for rank in part1 + part2:
                    for batch in rank:
                        indices = [int(i) for i in batch["index"]]
                        self.assert_rows(batch, ref, indices, "then=%r" % (then,))
                        seen.update(indices)
                self.assertEqual(set(seen), set(range(n)), "every sample of the epoch")
                padding = sum(seen.values()) - n
                self.assertLess(padding, then[0], "only padding repeats a sample")
                self.assertEqual(len({len(rank) for rank in part2}), 1, "equal batch counts")


if __name__ == "__main__":
    unittest.main()
