"""Argument validation: bad arguments raise TypeError/ValueError before any call into
libferry or ferryd (these tests pass an address that would fail if ever contacted)."""

import os
import unittest

import ferry
from ferry import _placement

NOWHERE = "/nonexistent/ferry-test/ferryd.sock"


def make(**kwargs):
    args = dict(dataset=ferry.ImageFolder("/data"), batch_size=4,
                transform=ferry.CenterCrop(8), address=NOWHERE)
    args.update(kwargs)
    return ferry.Loader(**args)


class DatasetArgsTest(unittest.TestCase):
    def test_image_folder_path_is_made_absolute(self):
        self.assertEqual(ferry.ImageFolder("rel/dir").root, os.path.abspath("rel/dir"))

    def test_image_folder_rejects_non_paths(self):
        with self.assertRaises(TypeError):
            ferry.ImageFolder(3)
        with self.assertRaises(ValueError):
            ferry.ImageFolder("")

    def test_image_folder_exif_orientation(self):
        self.assertEqual(ferry.ImageFolder("/d")._spec(), {"image_folder": {"root": "/d"}})
        folder = ferry.ImageFolder("/d", exif_orientation=True)
        self.assertEqual(folder._spec(),
                         {"image_folder": {"root": "/d", "exif_orientation": True}})
        self.assertIn("exif_orientation=True", repr(folder))
        with self.assertRaisesRegex(TypeError, "ImageFolder exif_orientation must be a bool"):
            ferry.ImageFolder("/d", exif_orientation=1)
        with self.assertRaisesRegex(TypeError, "exif_orientation must be a bool"):
            ferry.WebDataset("/a.tar", exif_orientation="yes")
        self.assertTrue(ferry.WebDataset("/a.tar", exif_orientation=True)
                        ._spec()["webdataset"]["exif_orientation"])

    def test_tokens_checks_dtypes_and_seq_len(self):
        with self.assertRaisesRegex(ValueError, "dtype must be one of"):
            ferry.Tokens("/t.bin", seq_len=8, dtype="int8")
        with self.assertRaisesRegex(ValueError, "output_dtype"):
            ferry.Tokens("/t.bin", seq_len=8, output_dtype="float32")
        with self.assertRaisesRegex(ValueError, "seq_len must be >= 1"):
            ferry.Tokens("/t.bin", seq_len=0)
        with self.assertRaises(TypeError):
            ferry.Tokens("/t.bin", seq_len=8.5)
        spec = ferry.Tokens("/t.bin", seq_len=8, dtype="uint32")._spec()
        self.assertEqual(spec["tokens"]["token_dtype"], "UINT32")
        self.assertEqual(spec["tokens"]["output_dtype"], "INT64")
        self.assertNotIn("widen_on_host", spec["tokens"])  # an older ferryd knows no such field
        spec = ferry.Tokens("/t.bin", seq_len=8, widen_on_host=True)._spec()
        self.assertIs(spec["tokens"]["widen_on_host"], True)
        with self.assertRaises(TypeError):
            ferry.Tokens("/t.bin", seq_len=8, widen_on_host="yes")

    def test_transforms(self):
        with self.assertRaisesRegex(ValueError, "size must be >= 1"):
            ferry.RandomResizedCrop(0)
        with self.assertRaisesRegex(ValueError, "0 < min <= max"):
            ferry.RandomResizedCrop(224, scale=(0.5, 0.1))
        with self.assertRaisesRegex(ValueError, "at most 1.0"):
            ferry.RandomResizedCrop(224, scale=(0.5, 1.5))
        with self.assertRaises(TypeError):
            ferry.RandomResizedCrop(224, flip=1)
        with self.assertRaisesRegex(ValueError, "resize must be >= 224"):
            ferry.CenterCrop(224, resize=200)
        spec = ferry.RandomResizedCrop(224, flip=True)._spec()["random_resized_crop"]
        self.assertEqual(spec["size"], 224)
        self.assertAlmostEqual(spec["scale_min"], 0.08)
        self.assertTrue(spec["flip"])
        self.assertNotIn("full_decode", spec)
        self.assertTrue(ferry.RandomResizedCrop(224, full_decode=True)._spec()[
            "random_resized_crop"]["full_decode"])
        self.assertTrue(ferry.CenterCrop(224, full_decode=True)._spec()[
            "center_crop"]["full_decode"])
        with self.assertRaises(TypeError):
            ferry.CenterCrop(224, full_decode="yes")


class LoaderArgsTest(unittest.TestCase):
    def test_dataset_type(self):
        with self.assertRaisesRegex(TypeError, "a ferry dataset"):
            make(dataset="/data")

    def test_dataloader_arguments_name_the_ferry_equivalent(self):
        for name, value, hint in (("num_workers", 8, "workers_per_node"),
                                  ("pin_memory", True, "pinned memory"),
                                  ("prefetch_factor", 2, "prefetch=N"),
                                  ("persistent_workers", True, "persist across epochs"),
                                  ("sampler", object(), "shuffle=, seed=, rank="),
                                  ("collate_fn", len, "collated")):
            with self.assertRaisesRegex(TypeError, "takes no %s= .*%s" % (name, hint)):
                make(**{name: value})
        with self.assertRaisesRegex(TypeError, "unexpected keyword argument 'batchsize'"):
            make(batchsize=3)

    def test_rank_and_world_size_come_from_the_launcher(self):
        saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}

        def restore():
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.addCleanup(restore)
        for k in saved:
            os.environ.pop(k, None)
        # Nothing set: rank 0 of 1, as DistributedSampler without a process group.
        self.assertEqual(_placement._resolve_rank(None, None), (0, 1))
        self.assertEqual(_placement._resolve_rank(2, 4), (2, 4))
        os.environ.update(RANK="3", WORLD_SIZE="8")
        self.assertEqual(_placement._resolve_rank(None, None), (3, 8))
        self.assertEqual(_placement._resolve_rank(3, None), (3, 8))
        self.assertEqual(_placement._resolve_rank(3, 8), (3, 8))
        with self.assertRaisesRegex(ValueError, r"rank=1 contradicts \$RANK/\$WORLD_SIZE, "
                                    r"which says rank 3 of 8"):
            make(rank=1)
        with self.assertRaisesRegex(ValueError, r"world_size=4 contradicts .* rank 3 of 8"):
            make(world_size=4)
        os.environ["RANK"] = "x"
        with self.assertRaisesRegex(ValueError, r"\$RANK='x' and \$WORLD_SIZE='8' must be "
                                    "integers"):
            make()
        # An initialized process group wins over the environment.
        import sys
        import types
        dist = types.ModuleType("torch.distributed")
        dist.is_available = lambda: True
        dist.is_initialized = lambda: True
        dist.get_rank = lambda: 5
        dist.get_world_size = lambda: 6
        saved_dist = sys.modules.get("torch.distributed")
        sys.modules["torch.distributed"] = dist
        try:
            self.assertEqual(_placement._resolve_rank(None, None), (5, 6))
            with self.assertRaisesRegex(ValueError, r"rank=0 contradicts torch.distributed, "
                                        "which says rank 5 of 6"):
                _placement._resolve_rank(0, None)
        finally:
            if saved_dist is None:
                del sys.modules["torch.distributed"]
            else:
                sys.modules["torch.distributed"] = saved_dist

    def test_torchrun_device_that_is_not_the_local_ranks_warns(self):
        import warnings
        saved = os.environ.get("LOCAL_RANK")
        self.addCleanup(lambda: os.environ.pop("LOCAL_RANK", None) if saved is None
                        else os.environ.__setitem__("LOCAL_RANK", saved))
        os.environ["LOCAL_RANK"] = "1"
        with self.assertWarnsRegex(RuntimeWarning, r"call torch.cuda.set_device\(local_rank\)"):
            _placement._warn_if_not_local_rank_device("cuda", 0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _placement._warn_if_not_local_rank_device("cuda", 1)    # set_device was called
            _placement._warn_if_not_local_rank_device("cuda:0", 0)  # named on purpose
            _placement._warn_if_not_local_rank_device("cpu", None)
            os.environ.pop("LOCAL_RANK")
            _placement._warn_if_not_local_rank_device("cuda", 0)    # not under torchrun

    def test_batch_size(self):
        for bad in (0, -1):
            with self.assertRaisesRegex(ValueError, "batch_size"):
                make(batch_size=bad)
        # ferryd's bound, as libferry exports it: refused before any call.
        from ferry import _lib
        self.assertEqual(_lib.job_limit("batch_size"), 1 << 20)
        with self.assertRaisesRegex(ValueError, r"batch_size must be <= 1048576, got 1048577"):
            make(batch_size=(1 << 20) + 1)
        for bad in (2.0, "4", True, None):
            with self.assertRaisesRegex(TypeError, "batch_size"):
                make(batch_size=bad)

    def test_image_folder_needs_a_transform(self):
        with self.assertRaisesRegex(ValueError, "needs a transform"):
            make(transform=None)
        with self.assertRaisesRegex(TypeError, "transform must be"):
            make(transform="center")

    def test_rank_and_world_size(self):
        with self.assertRaisesRegex(ValueError, r"rank must be < world_size \(2\)"):
            make(rank=2, world_size=2)
        with self.assertRaisesRegex(ValueError, "world_size must be >= 1"):
            make(world_size=0)
        with self.assertRaisesRegex(ValueError, "rank must be >= 0"):
            make(rank=-1)

    def test_seed_shuffle_device_prefetch_timeout(self):
        with self.assertRaisesRegex(ValueError, "seed"):
            make(seed=-1)
        with self.assertRaisesRegex(ValueError, "seed"):
            make(seed=2**64)
        with self.assertRaisesRegex(TypeError, "shuffle must be a bool"):
            make(shuffle="yes")
        with self.assertRaisesRegex(ValueError, "device must be 'cpu' or 'cuda\\[:N\\]'"):
            make(device="gpu")
        with self.assertRaisesRegex(ValueError, "prefetch must be <= 64"):
            make(prefetch=65)
        with self.assertRaisesRegex(ValueError, "timeout must be > 0"):
            make(timeout=0)
        with self.assertRaises(TypeError):
            make(address=5)
        with self.assertRaises(TypeError):
            make(job_name=7)


if __name__ == "__main__":
    unittest.main()
