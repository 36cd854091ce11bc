"""ferry.Records and ferry.Npy: argument checks, and end to end against a private ferryd
(FERRY_DAEMON or the build tree; skipped when no ferryd binary can be found)."""

import collections
import math
import os
import tempfile
import unittest

import numpy as np

import ferry
from support import HAVE_FERRYD, open_loader

try:
    import torch
except ImportError:
    torch = None


class RecordsArgsTest(unittest.TestCase):
    def test_spec_uses_proto_field_names(self):
        spec = ferry.Records("rel.bin", "bfloat16", shape=(3, 4), header_bytes=16)._spec()
        self.assertEqual(spec, {"records": {"path": os.path.abspath("rel.bin"),
                                            "dtype": "BFLOAT16", "shape": ["3", "4"],
                                            "header_bytes": "16"}})
        self.assertEqual(ferry.Records("/r", "uint8")._spec()["records"]["shape"], [])
        self.assertEqual(ferry.Records("/r", "int32", shape=5).shape, (5,))
        self.assertEqual(ferry.Npy("a.npy")._spec(), {"npy": {"path": os.path.abspath("a.npy")}})

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "dtype must be one of"):
            ferry.Records("/r", "float64")
        with self.assertRaisesRegex(ValueError, "dtype must be one of"):
            ferry.Records("/r", np.float32)
        with self.assertRaisesRegex(ValueError, r"shape\[1\] must be >= 1"):
            ferry.Records("/r", "uint8", shape=(3, 0))
        with self.assertRaises(TypeError):
            ferry.Records("/r", "uint8", shape="3")
        with self.assertRaises(TypeError):
            ferry.Records("/r", "uint8", shape=(3.0,))
        with self.assertRaisesRegex(ValueError, "header_bytes must be >= 0"):
            ferry.Records("/r", "uint8", header_bytes=-1)
        with self.assertRaises(ValueError):
            ferry.Records("", "uint8")
        with self.assertRaises(ValueError):
            ferry.Npy("")
        with self.assertRaises(TypeError):
            ferry.Npy(3)


@unittest.skipUnless(HAVE_FERRYD, "no ferryd binary (set FERRY_DAEMON)")
class RecordsEndToEndTest(unittest.TestCase):
    N = 37     # odd: with two ranks the epoch is padded by one sample
    N_NPY_INT = 40
    HEADER = 16

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        rng = np.random.default_rng(0)
        cls.rows = rng.standard_normal((cls.N, 3, 4)).astype("<f4")
        cls.records_path = cls.path("rows.f32")
        with open(cls.records_path, "wb") as f:
            f.write(b"H" * cls.HEADER)
            f.write(cls.rows.tobytes())
        cls.npy_path = cls.path("rows.npy")
        np.save(cls.npy_path, cls.rows)
        cls.ints = rng.integers(-2**62, 2**62, size=cls.N_NPY_INT, dtype=np.int64)
        cls.ints_path = cls.path("ints.npy")
        np.save(cls.ints_path, cls.ints)
        os.environ.pop("FERRY_ADDRESS", None)
        # Make sure the Loaders below start a private daemon rather than find a real one.
        os.environ["XDG_RUNTIME_DIR"] = cls.tmp.name

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @classmethod
    def path(cls, name):
        return os.path.join(cls.tmp.name, name)

    def loader(self, dataset, batch_size=5, **kwargs):
        return open_loader(self, dataset, batch_size, **kwargs)

    def two_ranks(self, dataset, job_name):
        common = dict(shuffle=True, seed=11, world_size=2, job_name=job_name)
        return self.loader(dataset, rank=0, **common), self.loader(dataset, rank=1, **common)

    def check_epoch(self, ranks, source, epoch):
        """Consumes one epoch on every rank; checks each row against source[index] and the
        DistributedSampler semantics (drop_last=False: the order is padded by repeating its
        head, so with N % world != 0 the first sample of rank 0 comes twice)."""
        per_rank = []
        for loader in ranks:
            loader.set_epoch(epoch)
            seen = []
            for batch in loader:
                data, index = batch["data"], batch["index"]
                self.assertEqual(index.dtype, np.int64)
                self.assertEqual(data.dtype, source.dtype)
                self.assertEqual(data.shape, (len(index),) + source.shape[1:])
                for row, i in zip(data, index):
                    np.testing.assert_array_equal(row, source[i])
                seen.extend(int(i) for i in index)
            per_rank.append(seen)
        n = len(source)
        padded = math.ceil(n / len(ranks)) * len(ranks)
        self.assertEqual([len(s) for s in per_rank], [padded // len(ranks)] * len(ranks))
        counts = collections.Counter(i for s in per_rank for i in s)
        self.assertEqual(set(counts), set(range(n)))
        twice = sorted(i for i, c in counts.items() if c == 2)
        self.assertEqual(max(counts.values()), 1 if padded == n else 2)
        self.assertEqual(twice, [per_rank[0][0]] if padded != n else [])
        return per_rank

    def test_records_two_ranks_shuffled(self):
        ranks = self.two_ranks(ferry.Records(self.records_path, "float32", shape=(3, 4),
                                             header_bytes=self.HEADER), "records-2r")
        self.assertEqual(len(ranks[0]), len(ranks[1]))
        self.assertEqual(len(ranks[0]), 4)  # 19 samples per rank in batches of 5
        first = self.check_epoch(ranks, self.rows, 0)
        second = self.check_epoch(ranks, self.rows, 1)
        self.assertNotEqual(first, second)
        self.assertNotEqual(first[0], sorted(first[0]))  # shuffled

    def test_npy_float32_rows_two_ranks_shuffled(self):
        ranks = self.two_ranks(ferry.Npy(self.npy_path), "npy-f32-2r")
        self.check_epoch(ranks, self.rows, 0)
        self.check_epoch(ranks, self.rows, 3)

    def test_npy_int64_vector_is_one_scalar_per_sample(self):
        ranks = self.two_ranks(ferry.Npy(self.ints_path), "npy-i64-2r")
        per_rank = self.check_epoch(ranks, self.ints, 0)
        self.assertEqual(sorted(per_rank[0] + per_rank[1]), list(range(self.N_NPY_INT)))

    def test_every_dtype_comes_out_with_its_dtype_and_shape(self):
        rng = np.random.default_rng(1)
        n = 6
        floats = rng.standard_normal((n, 2)).astype("<f4")
        bf16_bits = (floats.view(np.uint32) >> 16).astype("<u2")
        cases = {
            "uint8": rng.integers(0, 256, (n, 2)).astype("|u1"),
            "uint16": rng.integers(0, 2**16, (n, 2)).astype("<u2"),
            "uint32": rng.integers(0, 2**32, (n, 2)).astype("<u4"),
            "int32": rng.integers(-2**31, 2**31, (n, 2)).astype("<i4"),
            "int64": rng.integers(-2**62, 2**62, (n, 2)).astype("<i8"),
            "float16": floats.astype("<f2"),
            "bfloat16": bf16_bits,  # numpy output: the raw bits as uint16
            "float32": floats,
        }
        for dtype, source in cases.items():
            with self.subTest(dtype=dtype):
                path = self.path("dtype-%s.bin" % dtype)
                source.tofile(path)
                dataset = ferry.Records(path, dtype, shape=(2,))
                batch = next(iter(self.loader(dataset, batch_size=n, job_name="np-" + dtype)))
                self.assertEqual(batch["data"].dtype, source.dtype)
                self.assertEqual(batch["data"].shape, (n, 2))
                np.testing.assert_array_equal(batch["data"], source[batch["index"]])
                if torch is None:
                    continue
                for zero_copy in (False, True):
                    loader = self.loader(dataset, batch_size=n, as_numpy=False,
                                         zero_copy=zero_copy,
                                         job_name="torch-%s-%s" % (dtype, zero_copy))
                    tb = next(iter(loader))
                    data, index = tb["data"], tb["index"].numpy()
                    self.assertEqual(tuple(data.shape), (n, 2))
                    expected = {"uint8": torch.uint8, "uint16": torch.int32,
                                "uint32": torch.int64, "int32": torch.int32,
                                "int64": torch.int64, "float16": torch.float16,
                                "bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
                    self.assertEqual(data.dtype, expected)
                    if dtype == "bfloat16":
                        values = (source.astype(np.uint32) << 16).view(np.float32)
                        np.testing.assert_array_equal(data.float().numpy(), values[index])
                    else:
                        np.testing.assert_array_equal(data.numpy(), source[index])

    def test_big_endian_npy_is_refused(self):
        path = self.path("big.npy")
        np.save(path, self.rows.astype(">f4"))
        with self.assertRaises(ferry.FerryError) as cm:
            self.loader(ferry.Npy(path))
        self.assertIn("big-endian", cm.exception.message)
        self.assertIn(path, cm.exception.message)
        self.assertIn("newbyteorder", cm.exception.message)

    def test_fortran_order_npy_is_refused(self):
        path = self.path("fortran.npy")
        np.save(path, np.asfortranarray(self.rows[:, :, 0]))
        with self.assertRaises(ferry.FerryError) as cm:
            self.loader(ferry.Npy(path))
        self.assertIn("np.ascontiguousarray", cm.exception.message)

    def test_records_size_not_a_multiple_names_the_sizes(self):
        path = self.path("ragged.f32")
        with open(path, "wb") as f:
            f.write(b"\0" * 100)
        with self.assertRaises(ferry.FerryError) as cm:
            self.loader(ferry.Records(path, "float32", shape=(3, 4)))
        self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")
        message = cm.exception.message
        self.assertIn(path, message)
        self.assertIn("100 bytes", message)
        self.assertIn("48 bytes", message)

    def test_missing_file_names_the_path(self):
        path = self.path("missing.npy")
        with self.assertRaises(ferry.FerryError) as cm:
            self.loader(ferry.Npy(path))
        self.assertEqual(cm.exception.code, "NOT_FOUND")
        self.assertIn(path, cm.exception.message)


if __name__ == "__main__":
    unittest.main()
