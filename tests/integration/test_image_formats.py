"""Image formats through a real ferryd, against PIL (Debian's python3-pil) as the reference:
every PNG type (gray 1/2/4/8/16-bit, gray+alpha, palette 1/2/4/8-bit with tRNS, RGB and RGBA
8/16-bit, plain and Adam7-interlaced) must come out as PIL's Image.open(f).convert("RGB");
a PNG named .JPEG and a JPEG named .png are decoded by content; JPEGs and PNGs with EXIF
orientations 1-8 come out as PIL's ImageOps.exif_transpose(...).convert("RGB") with
exif_orientation=True and as stored without it; a broken PNG is a corrupt sample whose
message says why.

The transform is CenterCrop(S, resize=S) on images whose shorter side is S and whose longer
side exceeds it by an even number: the output is then exactly the central S x S square, with
no resampling, so PNG must match PIL exactly. JPEG may differ by JPEG_TOLERANCE per channel
(both sides use Debian's libjpeg-turbo, but ferry reads a JPEG that needs no turning through
its crop-aware decode, which need not give PIL's bits in every pixel)."""

import io
import itertools
import os
import random
import sys
import unittest

import numpy as np
from PIL import Image, ImageOps

import ferry
import ferry_it

sys.path.insert(0, os.path.join(ferry_it.HERE, "..", "..", "testing"))
import png_writer as pw  # noqa: E402

S = 16            # output side, and every image's shorter side
LONG = 24         # the longer side of the non-square images
JPEG_TOLERANCE = 2

# (name, colour type, bit depth)
PNG_TYPES = [("gray1", pw.COLOR_GRAY, 1), ("gray2", pw.COLOR_GRAY, 2),
             ("gray4", pw.COLOR_GRAY, 4), ("gray8", pw.COLOR_GRAY, 8),
             ("gray16", pw.COLOR_GRAY, 16), ("gray_alpha8", pw.COLOR_GRAY_ALPHA, 8),
             ("gray_alpha16", pw.COLOR_GRAY_ALPHA, 16), ("palette1", pw.COLOR_PALETTE, 1),
             ("palette2", pw.COLOR_PALETTE, 2), ("palette4", pw.COLOR_PALETTE, 4),
             ("palette8", pw.COLOR_PALETTE, 8), ("rgb8", pw.COLOR_RGB, 8),
             ("rgb16", pw.COLOR_RGB, 16), ("rgba8", pw.COLOR_RGBA, 8),
             ("rgba16", pw.COLOR_RGBA, 16)]


def random_png(rng, color_type, depth, interlace, width=LONG, height=S, exif=None,
               exif_after_idat=False):
    channels = pw.CHANNELS[color_type]
    palette = trns = None
    if color_type == pw.COLOR_PALETTE:
        # A palette shorter than the index range: indices past it are gray in PIL.
        entries = max(2, (1 << depth) - 3) if depth > 1 else 2
        palette = [tuple(rng.randrange(256) for _ in range(3)) for _ in range(entries)]
        trns = bytes(rng.randrange(256) for _ in range(min(entries, 5)))
    elif color_type == pw.COLOR_GRAY:
        trns = (3).to_bytes(2, "big")  # a transparent gray level: ignored by convert("RGB")
    pixels = [[tuple(rng.randrange(1 << depth) for _ in range(channels))
               for _ in range(width)] for _ in range(height)]
    if depth == 16:  # make sure 16-bit gray holds values on both sides of 255
        pixels[0][0] = tuple(rng.randrange(256) for _ in range(channels))
    return pw.encode_png(width, height, color_type, depth, pixels, interlace=interlace,
                         palette=palette, trns=trns, exif=exif, exif_after_idat=exif_after_idat)


def photo(rng, width, height):
    """A smooth RGB image (JPEG keeps it well) with some texture."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 9 + 20, y * 7 + 40, (x + y) * 4 + 60], -1)
    noise = np.array([[[rng.randrange(12) for _ in range(3)] for _ in range(width)]
                      for _ in range(height)])
    return Image.fromarray(((base + noise) % 256).astype(np.uint8))


def jpeg_with_orientation(image, orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    image.save(out, "JPEG", quality=95, exif=exif.tobytes())
    return out.getvalue()


def pil_reference(path, exif_orientation):
    """What torchvision's ImageFolder + CenterCrop(S) gives: PIL's RGB image, turned by
    exif_transpose when asked, and its central S x S square."""
    image = Image.open(path)
    if exif_orientation:
        image = ImageOps.exif_transpose(image)
    rgb = np.asarray(image.convert("RGB"))
    h, w = rgb.shape[:2]
    assert min(h, w) == S and (max(h, w) - S) % 2 == 0, (path, rgb.shape)
    top, left = (h - S) // 2, (w - S) // 2
    return rgb[top:top + S, left:left + S]


class ImageFormatsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = ferry_it.FerryDaemon()
        cls.root = os.path.join(cls.daemon.dir, "images")
        rng = random.Random(2024)
        files = {}
        for name, color_type, depth in PNG_TYPES:
            for interlace in (False, True):
                suffix = "_adam7" if interlace else ""
                # Alternate landscape and portrait.
                w, h = (LONG, S) if len(files) % 2 == 0 else (S, LONG)
                files["png/%s%s.png" % (name, suffix)] = random_png(
                    rng, color_type, depth, interlace, w, h)
        # ImageNet's n02105855_2933.JPEG is a PNG; and a JPEG named .png.
        files["renamed/png_named.JPEG"] = random_png(rng, pw.COLOR_RGB, 8, False)
        out = io.BytesIO()
        photo(rng, LONG, S).save(out, "JPEG", quality=95)
        files["renamed/jpeg_named.png"] = out.getvalue()
        # Orientations 1-8 on a landscape image: 5-8 make it portrait.
        for o in range(1, 9):
            files["exif/jpeg_%d.jpg" % o] = jpeg_with_orientation(photo(rng, LONG, S), o)
            files["exif/png_%d.png" % o] = random_png(
                rng, pw.COLOR_RGB, 8, o % 2 == 0, exif=pw.exif_orientation_block(o, o > 4),
                exif_after_idat=o == 3)
        for relative, data in files.items():
            os.makedirs(os.path.dirname(os.path.join(cls.root, relative)), exist_ok=True)
            with open(os.path.join(cls.root, relative), "wb") as f:
                f.write(data)
        cls.samples = ferry_it.expected_samples(cls.root)
        cls.jobs = itertools.count()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def delivered(self, exif_orientation):
        """{path: image} for one epoch of the whole folder, no sample skipped."""
        loader = ferry.Loader(ferry.ImageFolder(self.root, exif_orientation=exif_orientation),
                              batch_size=4, transform=ferry.CenterCrop(S, resize=S),
                              address=self.daemon.address, as_numpy=True, timeout=60,
                              job_name="formats-%d" % next(self.jobs))
        self.addCleanup(loader.close)
        images = {}
        for batch in loader:
            for image, index in zip(batch["image"], batch["index"]):
                images[self.samples[int(index)][0]] = np.array(image)
        status = ferry_it.ferryctl(self.daemon.address, "job", loader.job["id"])
        self.assertEqual(int(status.get("errors", 0)), 0, status.get("recent_errors"))
        self.assertEqual(len(images), len(self.samples))
        return images

    def check(self, images, exif_orientation):
        worst = {"png": 0, "jpeg": 0}
        for path, got in images.items():
            want = pil_reference(path, exif_orientation)
            diff = int(np.abs(got.astype(int) - want.astype(int)).max())
            with open(path, "rb") as f:
                is_png = f.read(4) == b"\x89PNG"
            kind = "png" if is_png else "jpeg"
            worst[kind] = max(worst[kind], diff)
            self.assertLessEqual(diff, 0 if is_png else JPEG_TOLERANCE,
                                 "%s (exif_orientation=%s): max difference %d from PIL"
                                 % (path, exif_orientation, diff))
        print("exif_orientation=%s: largest difference from PIL: PNG %d, JPEG %d"
              % (exif_orientation, worst["png"], worst["jpeg"]))

    def test_every_png_type_and_renamed_files_match_pil(self):
        self.assertEqual(len(self.samples), 2 * len(PNG_TYPES) + 2 + 16)
        self.check(self.delivered(exif_orientation=False), exif_orientation=False)

    def test_exif_orientation_matches_pil_exif_transpose(self):
        images = self.delivered(exif_orientation=True)
        self.check(images, exif_orientation=True)
        # The option matters: with it, orientations 5-8 come out transposed, not as stored.
        stored = self.delivered(exif_orientation=False)
        for o in range(2, 9):
            path = os.path.join(self.root, "exif", "png_%d.png" % o)
            self.assertFalse(np.array_equal(images[path], stored[path]), path)

    def test_broken_png_is_a_corrupt_sample_naming_the_reason(self):
        root = os.path.join(self.daemon.dir, "broken")
        os.makedirs(os.path.join(root, "c"))
        good = random_png(random.Random(1), pw.COLOR_RGB, 8, False)
        damaged = bytearray(good)
        damaged[-13] ^= 0x01  # the CRC of the image data chunk (IEND is the last 12 bytes)
        # More good files than bad: a job with more bad samples than good stops.
        files = {"good.png": good, "good_2.png": good, "good_3.png": good, "good_4.png": good,
                 "truncated.png": good[:len(good) // 2],
                 "damaged_crc.png": bytes(damaged), "gif.jpg": b"GIF89a" + bytes(64)}
        for name, data in files.items():
            with open(os.path.join(root, "c", name), "wb") as f:
                f.write(data)
        loader = ferry.Loader(ferry.ImageFolder(root), batch_size=1,
                              transform=ferry.CenterCrop(S, resize=S),
                              address=self.daemon.address, as_numpy=True, timeout=60)
        self.addCleanup(loader.close)
        self.assertEqual(sum(len(b["index"]) for b in loader), 7)  # substitutes fill in
        status = ferry_it.ferryctl(self.daemon.address, "job", loader.job["id"])
        messages = {os.path.basename(e["path"]): e["message"] for e in status["recent_errors"]}
        self.assertEqual(set(messages), {"truncated.png", "damaged_crc.png", "gif.jpg"}, status)
        self.assertIn("cannot decode PNG", messages["truncated.png"])
        self.assertIn("cannot decode PNG: invalid chunk checksum", messages["damaged_crc.png"])
        self.assertIn("not a JPEG or PNG", messages["gif.jpg"])
        self.assertIn("looks like a GIF", messages["gif.jpg"])


if __name__ == "__main__":
    unittest.main()
