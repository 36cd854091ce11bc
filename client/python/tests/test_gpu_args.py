"""The GPU transport's Python side without a GPU: argument checks for device, image_dtype,
mean and std; the JobSpec JSON (image_output, the PCI-bus-id device form); and the errors a
cuda Loader gives when this process has no usable GPU, torch or CUDA build. No ferryd is
contacted (the address would fail if it were)."""

import json
import os
import subprocess
import sys
import unittest
from unittest import mock

import ferry
from ferry import _lib, _placement, _spec, loader

NOWHERE = "/nonexistent/ferry-test/ferryd.sock"


def make(**kwargs):
    args = dict(dataset=ferry.ImageFolder("/data"), batch_size=4,
                transform=ferry.CenterCrop(8), address=NOWHERE)
    args.update(kwargs)
    return ferry.Loader(**args)


try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


def torch_cuda_usable():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


class DeviceArgsTest(unittest.TestCase):
    def test_device_forms(self):
        self.assertIsNone(_placement._parse_device("cpu"))
        self.assertEqual(_placement._parse_device("cuda:3"), 3)
        for bad in ("cuda:", "cuda:-1", "gpu:0", "cuda:0000:3b:00.0", "CPU"):
            with self.assertRaisesRegex(ValueError, "'cpu' or 'cuda\\[:N\\]'"):
                make(device=bad)
        with self.assertRaises(TypeError):
            make(device=0)
        # "cuda" is the current device, as torch has it.
        with mock.patch.object(_placement, "_current_cuda_ordinal", lambda d: 2):
            self.assertEqual(_placement._parse_device("cuda"), 2)

    @unittest.skipUnless(HAVE_TORCH, "needs torch")
    def test_torch_device_objects(self):
        import torch
        self.assertIsNone(_placement._parse_device(torch.device("cpu")))
        self.assertEqual(_placement._parse_device(torch.device("cuda", 1)), 1)
        self.assertEqual(_placement._parse_device(torch.device("cuda:3")), 3)
        with mock.patch.object(_placement, "_current_cuda_ordinal", lambda d: 5):
            self.assertEqual(_placement._parse_device(torch.device("cuda")), 5)
        with self.assertRaisesRegex(ValueError, "'cpu' or 'cuda\\[:N\\]'"):
            _placement._parse_device(torch.device("meta"))

    def test_image_dtype(self):
        with self.assertRaisesRegex(ValueError, "image_dtype must be one of"):
            make(device="cuda:0", image_dtype="float64")
        with self.assertRaisesRegex(ValueError, "image_dtype must be one of"):
            make(image_dtype=None)
        with self.assertRaisesRegex(ValueError, "needs device='cuda:N'"):
            make(image_dtype="float32")
        with self.assertRaisesRegex(ValueError, "image datasets only"):
            make(dataset=ferry.Tokens("/t.bin", seq_len=4), transform=None, device="cuda:0",
                 image_dtype="bfloat16")

    def test_mean_std(self):
        with self.assertRaisesRegex(ValueError, "mean/std apply to normalized images"):
            make(device="cuda:0", mean=(0.5, 0.5, 0.5))
        with self.assertRaisesRegex(TypeError, "3 numbers"):
            make(device="cuda:0", image_dtype="float32", mean=(0.5, 0.5))
        with self.assertRaisesRegex(TypeError, "3 numbers"):
            make(device="cuda:0", image_dtype="float32", std="abc")
        with self.assertRaisesRegex(ValueError, "std must be > 0"):
            make(device="cuda:0", image_dtype="float32", std=(0.2, 0.0, 0.2))
        with self.assertRaisesRegex(ValueError, "finite"):
            make(device="cuda:0", image_dtype="float32", mean=(0.5, float("nan"), 0.5))

    def test_as_numpy_cannot_hold_gpu_batches(self):
        with self.assertRaisesRegex(ValueError, "as_numpy=True cannot hold GPU batches"):
            make(device="cuda:0", as_numpy=True)


class JobSpecTest(unittest.TestCase):
    def spec(self, **kwargs):
        args = dict(dataset=ferry.ImageFolder("/data"), batch_size=4,
                    transform=ferry.CenterCrop(8), shuffle=True, seed=7, drop_last=False,
                    world_size=1, prefetch=4, image_output=None)
        args.update(kwargs)
        return _spec._job_spec(**args)

    def test_uint8_has_no_image_output(self):
        out = _spec._image_output(ferry.ImageFolder("/d"), 0, "uint8", None, None)
        self.assertIsNone(out)
        self.assertNotIn("image_output", self.spec())

    def test_normalized_image_output_in_json(self):
        out = _spec._image_output(ferry.ImageFolder("/d"), 0, "bfloat16",
                                   [0.485, 0.456, 0.406], (0.229, 0.224, 0.225))
        spec = json.loads(json.dumps(self.spec(image_output=out,
                                               device="cuda:0000:3b:00.0")))
        self.assertEqual(spec["device"], "cuda:0000:3b:00.0")
        self.assertEqual(spec["image_output"]["dtype"], "BFLOAT16")
        self.assertEqual(spec["image_output"]["mean"], [0.485, 0.456, 0.406])
        self.assertEqual(spec["image_output"]["std"], [0.229, 0.224, 0.225])
        default = _spec._image_output(ferry.ImageFolder("/d"), 0, "float16", None, None)
        self.assertEqual(default, {"dtype": "FLOAT16"})  # ferryd's ImageNet defaults

    def test_loader_attaches_its_gpu_by_pci_bus_id(self):
        # Pretend torch sees a GPU and libferry knows its bus id; stop at the connect.
        seen = {}

        def fake_create_job(client, spec, name=None):
            seen["spec"] = spec
            return {"id": "j1", "name": "n", "spec": spec, "batches_per_epoch": "1"}

        def fake_attach(client, job_id, rank, device=None):
            seen["attach"] = (job_id, rank, device)
            raise ferry.FerryError("UNAVAILABLE", "stop here")

        with mock.patch.object(loader, "_torch_cuda_device", lambda n: mock.Mock(index=n)), \
                mock.patch.object(_lib, "cuda_pci_bus_id", lambda n: "0000:3b:00.0"), \
                mock.patch("ferry.client.Client.__init__", lambda self, address=None: None), \
                mock.patch("ferry.client.Client.close", lambda self: None), \
                mock.patch("ferry.client.Client.create_job", fake_create_job), \
                mock.patch("ferry.client.Client.set_held_rank_wait", lambda self, s: None), \
                mock.patch("ferry.client.Client.set_reattach", lambda self, s, hook: None), \
                mock.patch("ferry.client.Client.attach", fake_attach):
            with self.assertRaisesRegex(ferry.FerryError, "stop here"):
                make(device="cuda:1", image_dtype="float32", mean=(0.5, 0.5, 0.5),
                     std=(0.25, 0.25, 0.25))
        spec = seen["spec"]
        # The job names no GPU (the ranks of a run on several GPUs share it); the rank names
        # its own by PCI bus id when it attaches.
        self.assertEqual(spec["device"], "cuda")
        self.assertEqual(seen["attach"], ("j1", 0, "cuda:0000:3b:00.0"))
        self.assertEqual(spec["image_output"],
                         {"dtype": "FLOAT32", "mean": [0.5, 0.5, 0.5], "std": [0.25] * 3})
        # Everything but the device and image_output matches a cpu job of the same spec.
        cpu = _spec._job_spec(ferry.ImageFolder("/data"), 4, ferry.CenterCrop(8), False, 0,
                               False, 1, 0, None)
        for key in cpu:
            if key != "device":
                self.assertEqual(spec[key], cpu[key], key)


class NoGpuTest(unittest.TestCase):
    @unittest.skipIf(torch_cuda_usable(), "this process has a usable GPU")
    def test_cuda_loader_without_gpu_is_failed_precondition(self):
        with self.assertRaises(ferry.FerryError) as cm:
            make(device="cuda:0")
        self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")
        self.assertRegex(cm.exception.message,
                         "install PyTorch|torch.cuda.is_available|cudaGetDeviceCount|"
                         "built without CUDA")

    @unittest.skipIf(torch_cuda_usable(), "this process has a usable GPU")
    def test_pci_bus_id_without_gpu(self):
        with self.assertRaises(ferry.FerryError) as cm:
            _lib.cuda_pci_bus_id(0)
        self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")
        self.assertRegex(cm.exception.message, "cudaGetDeviceCount|built without CUDA")

    def test_library_has_the_gpu_abi(self):
        self.assertGreaterEqual(_lib.minor(), 1)
        lib = _lib.load()
        for name in ("ferry_batch_wait", "ferry_batch_release_on", "ferry_batch_field_sized",
                     "ferry_cuda_pci_bus_id"):
            self.assertTrue(hasattr(lib, name), name)

    def test_host_batch_refuses_cuda_tensors(self):
        from ferry.client import Batch
        batch = Batch.__new__(Batch)
        batch._handle = None
        batch.device = -1
        with self.assertRaisesRegex(ferry.FerryError, "host memory"):
            batch.cuda_tensors()
        batch.device = 0
        with self.assertRaisesRegex(ferry.FerryError, "GPU memory"):
            batch.arrays()


if __name__ == "__main__":
    unittest.main()
