"""Two ranks in two processes, two epochs, through ferry.Loader against one ferryd."""

import collections
import os
import unittest

import ferry_it

BATCH = 8
WORLD = 2
EPOCHS = [0, 1]
CROP = 32


class TwoRanksTwoEpochsTest(unittest.TestCase):
    def setUp(self):
        self.daemon = ferry_it.FerryDaemon()
        self.addCleanup(self.daemon.stop)

    def run_ranks(self, counts, seed, job_name):
        root = ferry_it.make_image_folder(os.path.join(self.daemon.dir, job_name), counts)
        procs, outs = [], []
        for rank in range(WORLD):
            out = os.path.join(self.daemon.dir, "%s-rank%d.json" % (job_name, rank))
            cfg = dict(address=self.daemon.address, root=root, rank=rank, world_size=WORLD,
                       batch_size=BATCH, seed=seed, epochs=EPOCHS, crop=CROP, out=out,
                       job_name=job_name)
            log = out + ".log"
            procs.append((ferry_it.start_worker(cfg, log), log))
            outs.append(out)
        for proc, log in procs:
            code = proc.wait(120)
            self.assertEqual(code, 0, "rank worker failed:\n" + ferry_it.tail(log))
        results = [ferry_it.read_json(o) for o in outs]
        for r in results:
            self.assertTrue(r["done"], r.get("error"))
        self.assertEqual(results[0]["job_id"], results[1]["job_id"], "ranks must share a job")
        job = ferry_it.ferryctl(self.daemon.address, "job", results[0]["job_id"])
        for rank in range(WORLD):
            status = ferry_it.rank_status(job, rank)
            self.assertEqual(status.get("batch_channel", False), ferry_it.expect_batch_channel(),
                             status)
        return root, results

    def check_epochs(self, root, results, num_samples):
        expected = ferry_it.expected_samples(root)
        self.assertEqual(len(expected), num_samples)
        label_of = [label for _, label in expected]
        per_rank = -(-num_samples // WORLD)            # ceil(N / world)
        padding = per_rank * WORLD - num_samples
        batches = -(-per_rank // BATCH)                # drop_last=False: last batch short
        orders = []
        for epoch in EPOCHS:
            recs = [r["epochs"][str(epoch)] for r in results]
            # Equal batch counts on every rank (DDP must not hang), = len(loader).
            for r, rec in zip(results, recs):
                self.assertEqual(r["len"], batches)
                self.assertEqual(len(rec["index"]), batches, "epoch %d" % epoch)
            sizes = [[len(b) for b in rec["index"]] for rec in recs]
            want = [BATCH] * (batches - 1) + [per_rank - BATCH * (batches - 1)]
            self.assertEqual(sizes, [want] * WORLD, "epoch %d batch sizes" % epoch)
            for rec in recs:
                self.assertEqual(rec["image_dtype"], "torch.uint8")
                for shape, idx in zip(rec["image_shape"], rec["index"]):
                    self.assertEqual(shape, [len(idx), CROP, CROP, 3])
                for idx, lab, col in zip(rec["index"], rec["label"], rec["color_class"]):
                    self.assertEqual(lab, [label_of[i] for i in idx],
                                     "epoch %d: labels must be the class of each index" % epoch)
                    self.assertEqual(col, lab, "epoch %d: image rows must show their label's "
                                     "class colour" % epoch)
            # Rebuild the epoch's global order: rank r holds positions r, r + world, ...
            flat = [[i for b in rec["index"] for i in b] for rec in recs]
            order = [flat[p % WORLD][p // WORLD] for p in range(per_rank * WORLD)]
            self.assertEqual(sorted(order[:num_samples]), list(range(num_samples)),
                             "epoch %d: every sample exactly once before the padding" % epoch)
            # Padding repeats the head of the order; it is the only source of duplicates.
            self.assertEqual(order[num_samples:], order[:padding])
            counts = collections.Counter(order)
            dup = sorted(i for i, c in counts.items() if c > 1)
            self.assertEqual(dup, sorted(order[:padding]))
            self.assertTrue(all(c <= 2 for c in counts.values()))
            orders.append(order)
        self.assertNotEqual(orders[0], orders[1], "epoch 1 must be shuffled differently")
        return orders

    def test_divisible_dataset_covers_every_sample_once_per_epoch(self):
        # 48 = 3 x world_size x batch: no padding, every batch full.
        root, results = self.run_ranks({"cat": 16, "dog": 16, "eel": 16}, seed=11,
                                       job_name="even")
        orders = self.check_epochs(root, results, 48)
        for order in orders:
            self.assertEqual(sorted(order), list(range(48)))

    def test_indivisible_dataset_pads_by_repeating_the_head(self):
        # 37 samples, world 2: padded to 38 by repeating the order's first sample (it ends
        # up as rank 1's last sample); each rank gets 19 = 8 + 8 + 3 samples.
        root, results = self.run_ranks({"ant": 13, "bee": 12, "cow": 12}, seed=5,
                                       job_name="odd")
        orders = self.check_epochs(root, results, 37)
        for epoch, order in zip(EPOCHS, orders):
            rank0 = results[0]["epochs"][str(epoch)]["index"]
            rank1 = results[1]["epochs"][str(epoch)]["index"]
            self.assertEqual(rank1[-1][-1], rank0[0][0])


if __name__ == "__main__":
    unittest.main()
