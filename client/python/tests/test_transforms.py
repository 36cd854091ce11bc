"""ferry.transforms: the spec each op makes, argument checks, and end to end against a private
ferryd (FERRY_DAEMON or the build tree; skipped when no ferryd binary can be found): a
ViT-style Compose on the CPU path is deterministic per (seed, epoch, index) across reruns,
rank counts and a resume, and geometric ops give exact pixels."""

import os
import tempfile
import unittest

import numpy as np

import ferry
from ferry import transforms as T
from support import HAVE_FERRYD, open_loader

try:
    from PIL import Image
except ImportError:
    Image = None

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def vit_recipe(size=32):
    return T.Compose([
        T.RandomResizedCrop(size),
        T.RandomHorizontalFlip(),
        T.TrivialAugmentWide(),
        T.ColorJitter(0.4, 0.4, 0.4, 0.1),
        T.RandomGrayscale(0.2),
        T.Normalize(MEAN, STD),
        T.RandomErasing(0.5),
    ])


class TransformSpecTest(unittest.TestCase):
    def test_ops_make_the_job_spec_with_torchvisions_defaults(self):
        ops = vit_recipe(224)._spec()["compose"]["ops"]
        self.assertEqual(ops[0], {"random_resized_crop": {
            "size": 224, "scale": [0.08, 1.0], "ratio": [0.75, 4.0 / 3.0], "full_decode": False}})
        self.assertEqual(ops[1], {"random_horizontal_flip": {"p": 0.5}})
        self.assertEqual(ops[2], {"trivial_augment_wide": {"num_magnitude_bins": 31, "fill": []}})
        self.assertEqual(ops[3], {"color_jitter": {"brightness": [0.6, 1.4],
                                                   "contrast": [0.6, 1.4],
                                                   "saturation": [0.6, 1.4],
                                                   "hue": [-0.1, 0.1]}})
        self.assertEqual(ops[4], {"random_grayscale": {"p": 0.2}})
        self.assertEqual(ops[5], {"normalize": {"mean": list(MEAN), "std": list(STD)}})
        self.assertEqual(ops[6], {"random_erasing": {"p": 0.5, "scale": [0.02, 0.33],
                                                     "ratio": [0.3, 3.3], "value": [0.0]}})
        # torchvision's parsing: 0 means unset; a pair is [min, max]; brightness clips at 0.
        self.assertEqual(T.ColorJitter(brightness=0)._op()["color_jitter"]["brightness"], [])
        self.assertEqual(T.ColorJitter(brightness=1.5)._op()["color_jitter"]["brightness"],
                         [0.0, 2.5])
        self.assertEqual(T.ColorJitter(hue=(-0.2, 0.3))._op()["color_jitter"]["hue"], [-0.2, 0.3])
        self.assertEqual(T.RandomCrop(32, padding=4)._op()["random_crop"]["padding"], [4])
        self.assertEqual(T.RandomCrop((32, 32), padding=(1, 2))._op()["random_crop"]["size"], 32)
        # One op alone is a Compose of one.
        self.assertEqual(T.CenterCrop(8)._spec(), {"compose": {"ops": [{"center_crop":
                                                                        {"size": 8}}]}})
        self.assertIn("RandomResizedCrop(", repr(vit_recipe()))

    def test_bad_arguments_name_the_op_and_argument(self):
        with self.assertRaisesRegex(ValueError, "RandomHorizontalFlip p must be in"):
            T.RandomHorizontalFlip(1.5)
        with self.assertRaisesRegex(ValueError, "Resize size must be an int"):
            T.Resize((32, 48))
        with self.assertRaisesRegex(ValueError, "must be square"):
            T.CenterCrop((32, 48))
        with self.assertRaisesRegex(ValueError, "ColorJitter hue values must lie in"):
            T.ColorJitter(hue=0.7)
        with self.assertRaisesRegex(ValueError, "padding_mode"):
            T.RandomCrop(32, padding=4, padding_mode="wrap")
        with self.assertRaisesRegex(ValueError, "value='random' is not offered"):
            T.RandomErasing(value="random")
        with self.assertRaisesRegex(ValueError, "Normalize std must be > 0"):
            T.Normalize(MEAN, (1, 0, 1))
        with self.assertRaisesRegex(TypeError, "a Python function cannot be passed"):
            T.Compose([T.CenterCrop(8), lambda x: x])
        with self.assertRaisesRegex(TypeError, "ferry.transforms.Compose"):
            ferry.Loader(ferry.ImageFolder("/x"), batch_size=2, transform=lambda x: x)


def make_folder(root, count=24):
    """PNG images (lossless: exact pixel checks) of varied sizes with texture."""
    rng = np.random.default_rng(7)
    images = {}
    for i in range(count):
        w, h = int(rng.integers(40, 80)), int(rng.integers(36, 72))
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([(x * 3 + i * 11) % 256, (y * 5 + i * 7) % 256, (x * y + i) % 256], -1)
        pixels = np.clip(base + rng.integers(-20, 20, size=(h, w, 3)), 0, 255).astype(np.uint8)
        cls = "c%d" % (i % 3)
        os.makedirs(os.path.join(root, cls), exist_ok=True)
        Image.fromarray(pixels, "RGB").save(os.path.join(root, cls, "%03d.png" % i))
        images[i] = pixels
    return images


@unittest.skipUnless(HAVE_FERRYD, "no ferryd binary (set FERRY_DAEMON)")
@unittest.skipUnless(Image is not None, "PIL is not installed")
class ComposeEndToEndTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.root = cls.tmp.name
        cls.images = make_folder(cls.root)
        # ImageFolder's order: class-major, then file name.
        cls.order = sorted(cls.images, key=lambda i: ("c%d" % (i % 3), i))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def rows_by_index(self, loader, epochs=(0,)):
        rows = {}
        for epoch in epochs:
            loader.set_epoch(epoch)
            for batch in loader:
                for img, idx in zip(batch["image"], batch["index"]):
                    rows[(epoch, int(idx))] = np.array(img)
        return rows

    def test_vit_recipe_makes_normalized_chw_floats_deterministically(self):
        ds = ferry.ImageFolder(self.root)
        a = open_loader(self, ds, 4, transform=vit_recipe(), shuffle=True, seed=3)
        first = self.rows_by_index(a, epochs=(0, 1))
        self.assertEqual(len(first), 48)
        img = first[(0, 0)]
        self.assertEqual(img.dtype, np.float32)
        self.assertEqual(img.shape, (3, 32, 32))
        # Normalized: values span what (x / 255 - mean) / std reaches, not 0..255.
        lo = min(float(v.min()) for v in first.values())
        hi = max(float(v.max()) for v in first.values())
        self.assertGreaterEqual(lo, (0 - max(MEAN)) / min(STD) - 1e-4)
        self.assertLessEqual(hi, (1 - min(MEAN)) / min(STD) + 1e-4)
        # Epochs differ; a rerun, and two ranks of the same seed, give the same rows.
        self.assertFalse(np.array_equal(first[(0, 5)], first[(1, 5)]))
        a.close()  # the same spec is the same job, whose rank 0 it holds
        b = open_loader(self, ds, 4, transform=vit_recipe(), shuffle=True, seed=3)
        again = self.rows_by_index(b, epochs=(0, 1))
        b.close()
        for key, row in first.items():
            np.testing.assert_array_equal(again[key], row, err_msg=str(key))
        for rank in range(2):
            r = open_loader(self, ds, 2, transform=vit_recipe(), shuffle=True, seed=3,
                            rank=rank, world_size=2)
            for key, row in self.rows_by_index(r, epochs=(1,)).items():
                np.testing.assert_array_equal(row, first[key], err_msg=str(key))
        c = open_loader(self, ds, 4, transform=vit_recipe(), shuffle=True, seed=4)
        other = self.rows_by_index(c)
        self.assertFalse(all(np.array_equal(other[k], first[k]) for k in other))

    def test_resume_gives_the_same_augmented_batches(self):
        ds = ferry.ImageFolder(self.root)
        a = open_loader(self, ds, 4, transform=vit_recipe(), shuffle=True, seed=11)
        a.set_epoch(2)
        it = iter(a)
        for _ in range(2):
            next(it)
        state = a.state_dict()
        rest = [np.array(b["image"]) for b in it]
        a.close()
        b = open_loader(self, ds, 4, transform=vit_recipe(), shuffle=True, seed=11)
        b.load_state_dict(state)
        resumed = [np.array(x["image"]) for x in b]
        self.assertEqual(len(resumed), len(rest))
        for x, y in zip(resumed, rest):
            np.testing.assert_array_equal(x, y)

    def test_geometric_ops_give_exact_pixels(self):
        # CenterCrop(32) then a vertical flip that always happens: numpy says what it is.
        ds = ferry.ImageFolder(self.root)
        transform = T.Compose([T.CenterCrop(32), T.RandomVerticalFlip(p=1.0)])
        loader = open_loader(self, ds, 6, transform=transform)
        rows = self.rows_by_index(loader)
        for (_, index), row in rows.items():
            src = self.images[self.order[index]]
            h, w = src.shape[:2]
            top, left = int(round((h - 32) / 2.0)), int(round((w - 32) / 2.0))
            np.testing.assert_array_equal(row, src[top:top + 32, left:left + 32][::-1])

    def test_cifar_random_crop_with_padding(self):
        ds = ferry.ImageFolder(self.root)
        transform = T.Compose([T.CenterCrop(32), T.RandomCrop(32, padding=4),
                               T.RandomHorizontalFlip()])
        rows = self.rows_by_index(open_loader(self, ds, 8, transform=transform, seed=1))
        zero_rows = 0
        for row in rows.values():
            self.assertEqual(row.shape, (32, 32, 3))
            zero_rows += int((row.reshape(32, -1).max(axis=1) == 0).sum())
        self.assertGreater(zero_rows, 0)  # some crops show the zero padding

    def test_the_daemon_names_the_op_it_refuses(self):
        ds = ferry.ImageFolder(self.root)
        with self.assertRaisesRegex(ferry.FerryError,
                                    r"transform.compose.ops\[2\] \(ColorJitter\): comes after "
                                    r"Normalize"):
            loader = ferry.Loader(ds, batch_size=2, as_numpy=True, timeout=30, transform=T.Compose(
                [T.CenterCrop(8), T.Normalize(MEAN, STD), T.ColorJitter(0.2)]))
            self.addCleanup(loader.close)
            next(iter(loader))
        with self.assertRaisesRegex(ferry.FerryError, "output size depends on each image"):
            loader = ferry.Loader(ds, batch_size=2, as_numpy=True, timeout=30,
                                  transform=T.Resize(40))
            self.addCleanup(loader.close)
            next(iter(loader))


if __name__ == "__main__":
    unittest.main()
