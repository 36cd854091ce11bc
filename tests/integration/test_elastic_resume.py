"""Elastic resume: a state saved by a run on N ranks with batch size B resumes on M ranks
with batch size B', mid-epoch, and across the two runs every sample of the epoch is
delivered exactly once (besides DistributedSampler's padding), for every dataset kind, with
shuffle on and off, with quarantined samples and across ferryd restarts; states of another
dataset, seed or shuffle, edited states and ranks that load different states are refused.

The oracle is ferry's own uninterrupted epoch on one rank (its order, every position once):
the resumed runs' indices must be that multiset plus at most the padding."""

import collections
import io
import os
import signal
import sys
import tarfile
import unittest

import numpy as np

import ferry
import ferry_it

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "testing"))
import megatron_indexed  # noqa: E402

SEED = 5


def write_webdataset(directory, shards=4, per_shard=7):
    colors = [(200, 30, 30), (30, 200, 30), (30, 30, 200)]
    for s in range(shards):
        with tarfile.open(os.path.join(directory, "shard-%d.tar" % s), "w") as tar:
            for m in range(per_shard):
                n = s * per_shard + m
                for ext, data in ((".jpg", ferry_it.jpeg_bytes(colors[n % 3], variant=n)),
                                  (".cls", str(n % 3).encode())):
                    info = tarfile.TarInfo("%06d%s" % (n, ext))
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return os.path.join(directory, "shard-{0..%d}.tar" % (shards - 1))


class ElasticResumeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = ferry_it.FerryDaemon()
        d = cls.daemon.dir
        rng = np.random.default_rng(3)
        images = ferry_it.make_image_folder(os.path.join(d, "images"), {"owl": 13, "yak": 14})
        rows = rng.standard_normal((31, 3)).astype("<f4")
        rows.tofile(os.path.join(d, "rows.f32"))
        np.save(os.path.join(d, "rows.npy"), rows[:23])
        (np.arange(101) % 50000).astype(np.uint16).tofile(os.path.join(d, "t.bin"))
        for i, n in enumerate((41, 30)):
            rng.integers(0, 2**16, size=n, dtype=np.uint16).tofile(
                os.path.join(d, "shard-%d.bin" % i))
        documents = [[list(rng.integers(0, 60000, size=rng.integers(1, 15)))]
                     for _ in range(25)]
        megatron_indexed.write_indexed(os.path.join(d, "wiki"), documents)
        wds = write_webdataset(os.path.join(d))
        crop = ferry.RandomResizedCrop(16, flip=True)
        cls.kinds = {
            "images": (ferry.ImageFolder(images), crop),
            "webdataset": (ferry.WebDataset(wds), crop),
            "records": (ferry.Records(os.path.join(d, "rows.f32"), "float32", shape=(3,)), None),
            "npy": (ferry.Npy(os.path.join(d, "rows.npy")), None),
            "tokens": (ferry.Tokens(os.path.join(d, "t.bin"), 4), None),
            "token_shards": (ferry.TokenShards(os.path.join(d, "shard-{0..1}.bin"), 3), None),
            "indexed": (ferry.IndexedDataset(os.path.join(d, "wiki"), 5), None),
            "blend": (ferry.Blend([ferry.Tokens(os.path.join(d, "t.bin"), 4),
                                   ferry.TokenShards(os.path.join(d, "shard-{0..1}.bin"), 4)],
                                  weights=[0.7, 0.3]), None),
        }

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def loaders(self, kind, world_size, batch_size, shuffle=True, drop_last=False, seed=SEED):
        dataset, transform = self.kinds[kind]
        out = []
        for rank in range(world_size):
            loader = ferry.Loader(dataset, batch_size=batch_size, transform=transform,
                                  shuffle=shuffle, seed=seed, drop_last=drop_last, rank=rank,
                                  world_size=world_size, address=self.daemon.address,
                                  as_numpy=True, prefetch=2, timeout=30)
            self.addCleanup(loader.close)
            out.append(loader)
        return out

    def take(self, loaders, count=None):
        """Indices each rank got from its next `count` batches of its current iteration (a
        new one once the last ended; all that are left: None)."""
        if not hasattr(self, "iterators"):
            self.iterators = {}
        got = []
        for loader in loaders:
            rows = []
            it = self.iterators.get(id(loader))
            if it is None:
                it = self.iterators[id(loader)] = iter(loader)
            while count is None or len(rows) < count:
                batch = next(it, None)
                if batch is None:
                    del self.iterators[id(loader)]
                    break
                rows.append([int(i) for i in batch["index"]])
            got.append([i for b in rows for i in b])
        return got

    def take_closing(self, loaders, count=None):
        got = self.take(loaders, count)
        for loader in loaders:
            self.iterators.pop(id(loader), None)
            loader.close()
        return got

    def epoch_order(self, kind, shuffle):
        (whole,) = self.take_closing(self.loaders(kind, 1, 1, shuffle=shuffle))
        return whole

    def check_once(self, order, delivered, padding_allowed, what):
        want = collections.Counter(order)
        got = collections.Counter(i for rank in delivered for i in rank)
        missing = want - got
        self.assertFalse(missing, "%s: samples never delivered: %s" % (what, dict(missing)))
        extra = sum((got - want).values())
        self.assertLessEqual(extra, padding_allowed,
                             "%s: %d samples delivered twice (padding allows %d)"
                             % (what, extra, padding_allowed))

    def resume(self, kind, shuffle, first, k, then, drop_last=False):
        """Run `first` = (N, B) for k batches per rank, then `then` = (M, B') to the end of
        the epoch; returns (indices of both runs, padding bound)."""
        run1 = self.loaders(kind, first[0], first[1], shuffle, drop_last)
        for loader in run1:
            loader.set_epoch(1)
        part1 = self.take(run1, k)
        states = [loader.state_dict() for loader in run1]
        for state in states[1:]:
            self.assertEqual(state, states[0], "the ranks of a run in step save one state")
        self.take_closing(run1, 0)
        run2 = self.loaders(kind, then[0], then[1], shuffle, drop_last)
        for loader in run2:
            loader.load_state_dict(states[0])
            loader.set_epoch(1)
        part2 = self.take_closing(run2)
        counts = {len(r) for r in part2}
        self.assertLessEqual(len(counts), 1, "ranks of a run got different batch counts")
        return part1 + part2, first[0] + then[0]

    def test_every_kind_resumes_on_other_world_and_batch_sizes(self):
        plans = [((4, 2), 2, (3, 3)), ((2, 3), 1, (5, 1)), ((3, 1), 4, (1, 4))]
        for kind in self.kinds:
            for shuffle in (True, False):
                order = None
                for first, k, then in plans:
                    with self.subTest(kind=kind, shuffle=shuffle, first=first, then=then):
                        if order is None:
                            run = self.loaders(kind, 1, 1, shuffle)
                            run[0].set_epoch(1)
                            (order,) = self.take_closing(run)
                        delivered, padding = self.resume(kind, shuffle, first, k, then)
                        self.check_once(order, delivered, padding, kind)

    def test_drop_last_leaves_out_only_what_the_last_run_cuts(self):
        run = self.loaders("records", 1, 1)
        run[0].set_epoch(1)
        (order,) = self.take_closing(run)
        delivered, _ = self.resume("records", True, (4, 2), 2, (3, 2), drop_last=True)
        got = collections.Counter(i for rank in delivered for i in rank)
        self.assertEqual(max(got.values()), 1, "a sample was delivered twice")
        # 31 rows: run 1 took 16; 15 left over 3 ranks of batch 2: 2 batches each, 3 cut.
        self.assertEqual(sum(got.values()), 16 + 12)
        self.assertTrue(set(got) <= set(order))

    def test_a_resumed_run_resumes_again_and_the_next_epoch_is_whole(self):
        order = self.epoch_order("tokens", True)  # epoch 0
        run1 = self.loaders("tokens", 4, 2)
        part1 = self.take(run1, 1)
        state = run1[0].state_dict()
        self.take_closing(run1, 0)
        run2 = self.loaders("tokens", 3, 1)
        for loader in run2:
            loader.load_state_dict(state)
        part2 = self.take(run2, 2)
        # ferryctl says which ranks resume an epoch begun elsewhere, and after how much.
        rank = ferry_it.rank_status(ferry_it.ferryctl(self.daemon.address, "job",
                                                      run2[0].job["id"]), 0)
        self.assertEqual(int(rank.get("resumed_after_positions", 0)), 8, rank)
        self.assertEqual(int(rank.get("epoch_batches", 0)), 6, rank)  # 17 left over 3 ranks
        state2 = run2[0].state_dict()
        self.assertEqual(state2["consumed"], [[0, 14]])
        self.take_closing(run2, 0)
        run3 = self.loaders("tokens", 2, 5)
        for loader in run3:
            loader.load_state_dict(state2)
        part3 = self.take(run3)
        self.check_once(order, part1 + part2 + part3, 4 + 3 + 2, "tokens")
        # The epoch after is that of a run that had 2 ranks from its start.
        for loader in run3:
            loader.set_epoch(1)
        next_epoch = self.take_closing(run3)
        fresh = self.loaders("tokens", 2, 5)
        for loader in fresh:
            loader.set_epoch(1)
        self.assertEqual(next_epoch, self.take_closing(fresh))

    def test_the_same_world_size_continues_the_same_deal(self):
        # Rank 1 restarts alone while rank 0 goes on: it loads the state at its own world
        # and batch size and continues at its batch, so the two stay one deal.
        ref = self.take_closing(self.loaders("images", 2, 4))
        run = self.loaders("images", 2, 4)
        first = self.take(run[1:], 2)[0]
        state = run[1].state_dict()
        self.assertEqual((state["batches_done"], state["resumed_from"]), (2, []))
        self.take_closing(run[1:], 0)
        again = ferry.Loader(self.kinds["images"][0], batch_size=4,
                             transform=self.kinds["images"][1], shuffle=True, seed=SEED,
                             rank=1, world_size=2, address=self.daemon.address, as_numpy=True,
                             prefetch=2, timeout=30)
        self.addCleanup(again.close)
        again.load_state_dict(state)
        rest = self.take([again])[0]
        self.assertEqual(first + rest, ref[1])
        self.assertEqual(self.take(run[:1])[0], ref[0])

    def test_refuses_a_state_of_another_order_an_edited_state_and_mixed_ranks(self):
        run = self.loaders("tokens", 2, 2)
        self.take(run, 1)
        state = run[0].state_dict()
        for kwargs, word in (({"seed": SEED + 1}, "seed"), ({"shuffle": False}, "shuffle")):
            other = self.loaders("tokens", 2, 2, **kwargs)[0]
            with self.assertRaisesRegex(ValueError, "its %s is" % word):
                other.load_state_dict(state)
        other = self.loaders("npy", 2, 2)[0]
        with self.assertRaisesRegex(ValueError, "its dataset is"):
            other.load_state_dict(state)
        edited = dict(state, consumed=[[0, 2]])
        fresh = self.loaders("tokens", 3, 2)
        with self.assertRaisesRegex(ValueError, "checksum does not match"):
            fresh[0].load_state_dict(edited)
        # Two ranks of one run that loaded different states: the second is refused.
        later = run[0]
        self.take([later], 1)
        state2 = later.state_dict()
        self.assertNotEqual(state2["consumed"], state["consumed"])
        fresh[0].load_state_dict(state)
        fresh[1].load_state_dict(state2)
        iter(fresh[0])
        with self.assertRaises(ferry.FerryError) as refused:
            iter(fresh[1])
        self.assertEqual(refused.exception.code, "FAILED_PRECONDITION")
        self.assertIn("must load the same state_dict", refused.exception.message)

    def test_refuses_a_state_of_a_newer_format_and_one_whose_dataset_changed_size(self):
        path = os.path.join(self.daemon.dir, "growing.bin")
        (np.arange(61) % 50000).astype(np.uint16).tofile(path)
        loader = ferry.Loader(ferry.Tokens(path, 4), batch_size=2, world_size=2, rank=0,
                              address=self.daemon.address, as_numpy=True, timeout=30)
        self.addCleanup(loader.close)
        self.take([loader], 1)
        state = loader.state_dict()
        newer = self.loaders("tokens", 2, 2)[0]
        with self.assertRaisesRegex(ValueError, r"state\['format'\] is 3; this ferry reads "
                                    r"format 2 .* needs that ferry"):
            newer.load_state_dict(dict(state, format=3))
        # The same file, grown by 40 tokens (10 windows): the state's positions are not this
        # dataset's any more.
        (np.arange(101) % 50000).astype(np.uint16).tofile(path)
        grown = ferry.Loader(ferry.Tokens(path, 4), batch_size=3, world_size=2, rank=0,
                             address=self.daemon.address, as_numpy=True, timeout=30)
        self.addCleanup(grown.close)
        with self.assertRaisesRegex(ValueError, "saved with 15 positions per epoch, this "
                                    "Loader's dataset has 25: the dataset changed"):
            grown.load_state_dict(state)

    def test_a_state_of_the_older_form_is_read_at_this_world_size_with_a_warning(self):
        ref = self.take_closing(self.loaders("tokens", 2, 3))
        loader = self.loaders("tokens", 2, 3)[0]
        with self.assertWarnsRegex(UserWarning, "no world size or batch size"):
            loader.load_state_dict({"epoch": 0, "batches_done": 2, "quarantined": []})
        self.assertEqual(self.take([loader])[0], ref[0][6:])


class ElasticResumeAcrossRestartsTest(unittest.TestCase):
    """Saved on 4 ranks, everything killed (trainers and ferryd, kill -9), resumed on 3,
    killed again, resumed on 2 to the end of the epoch: every image of the epoch once, the
    cut-short one replaced by its substitute."""

    def setUp(self):
        self.daemon = ferry_it.FerryDaemon()
        self.addCleanup(self.daemon.stop)
        self.dir = self.daemon.dir
        self.root = ferry_it.make_image_folder(os.path.join(self.dir, "images"),
                                               {"owl": 21, "yak": 20})
        with open(os.path.join(self.root, "owl", "broken.jpg"), "wb") as f:
            f.write(ferry_it.jpeg_bytes((200, 30, 30))[:300])  # 42 files, one cut short

    def run_ranks(self, name, world_size, batch_size, pause_after=None, resume=None):
        procs = []
        for rank in range(world_size):
            cfg = dict(address=self.daemon.address, root=self.root, rank=rank,
                       world_size=world_size, batch_size=batch_size, seed=SEED, crop=16,
                       epochs=[0], out=os.path.join(self.dir, "%s%d.json" % (name, rank)))
            if pause_after is not None:
                cfg.update(pause_after=pause_after,
                           ready_file=os.path.join(self.dir, "%s%d.ready" % (name, rank)))
            if resume is not None:
                cfg["resume"] = resume
            proc = ferry_it.start_worker(cfg, os.path.join(self.dir, "%s%d.log" % (name, rank)))
            self.addCleanup(lambda p=proc: p.poll() is None and (p.kill(), p.wait()))
            procs.append((proc, cfg))
        results = []
        for proc, cfg in procs:
            if pause_after is not None:
                ferry_it.wait_for_file(cfg["ready_file"], 60, [proc], "rank readiness")
            else:
                self.assertEqual(proc.wait(120), 0, ferry_it.tail(cfg["out"][:-5] + ".log"))
            results.append(ferry_it.read_json(cfg["out"]))
        if pause_after is not None:
            for proc, _ in procs:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
        return results

    def test_four_ranks_then_three_then_two_after_ferryd_restarts(self):
        ref = self.run_ranks("ref", 1, 1)[0]
        order = [i for b in ref["epochs"]["0"]["index"] for i in b]
        self.assertEqual(len(order), 42)

        first = self.run_ranks("four", 4, 2, pause_after=2)
        states = [r["state"] for r in first]
        # One position for the whole run; the quarantine may have grown between two ranks'
        # saves (the ranks' prefetch reads on).
        for s in states:
            self.assertEqual((s["epoch"], s["consumed"]), (0, [[0, 16]]))
        self.daemon.restart(signal.SIGKILL)
        second = self.run_ranks("three", 3, 3, pause_after=1, resume=states[0])
        state2 = second[0]["state"]
        self.assertEqual(state2["consumed"], [[0, 16 + 9]])
        self.daemon.restart(signal.SIGKILL)
        third = self.run_ranks("two", 2, 4, resume=state2)

        delivered = [i for r in first + second + third for b in r["epochs"]["0"]["index"]
                     for i in b]
        # The cut-short file is quarantined and a substitute delivered in its place, by the
        # reference run as by the resumed ones.
        (broken,) = ref["state"]["quarantined"]
        want = collections.Counter(i for i in order if i != broken)
        got = collections.Counter(i for i in delivered if i != broken)
        self.assertFalse(want - got, "never delivered: %s" % dict(want - got))
        # 17 left over 2 ranks: 1 padding; the substitute of the broken file: 1 more.
        self.assertLessEqual(sum((got - want).values()), 2)


if __name__ == "__main__":
    unittest.main()
