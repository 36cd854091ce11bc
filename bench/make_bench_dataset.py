#!/usr/bin/env python3
"""Writes the benchmark dataset: ImageNet-like JPEGs made from real photographs.

Sources: the colour photographs that scikit-image (skimage/data) and matplotlib
(mpl-data/sample_data) ship, or every image under --photos DIR. Real photographs matter:
their entropy-coded data (textures, noise, edges) costs a decoder what ImageNet's does,
which smooth synthetic images do not.

Each output image is a random crop of a random source (area 10-100% of the photo, aspect
3:4 to 4:3), a random horizontal flip and a small colour shift, resized so its shorter
side is 300-500 px (ImageNet's training images are mostly 333-500 px on the shorter
side), saved as baseline JPEG at quality 75-95 with 4:2:0 chroma subsampling, like the
typical ImageNet file.

Layouts written under OUT:
  OUT/imagefolder/n1000000c/<n>.jpg       C classes x M images (label = class index)
  OUT/shards/train-000000.tar ...         WebDataset shards of the same images, in the
                                          same order: <key>.jpg + <key>.cls (label)
  OUT/tokens.u16                          with --tokens-mb: uniform random uint16 ids

Deterministic from --seed. Needs numpy and PIL.

  python3 bench/make_bench_dataset.py OUT --classes 50 --images-per-class 256
"""

import argparse
import glob
import io
import multiprocessing
import os
import sys
import tarfile
import time

import numpy as np
from PIL import Image

_MIN_SIDE = 256  # sources smaller than this are not photographs worth cropping


def find_photos(photos_dir):
    """Paths of colour photographs to crop from."""
    candidates = []
    if photos_dir:
        for ext in ("jpg", "jpeg", "png", "JPG", "JPEG", "PNG"):
            candidates += glob.glob(os.path.join(photos_dir, "**", "*." + ext), recursive=True)
    else:
        for module, sub in (("skimage", "data"), ("matplotlib", os.path.join("mpl-data", "sample_data"))):
            try:
                mod = __import__(module)
            except ImportError:
                continue
            root = os.path.join(os.path.dirname(mod.__file__), sub)
            for ext in ("jpg", "png"):
                candidates += glob.glob(os.path.join(root, "**", "*." + ext), recursive=True)
    photos = []
    for path in sorted(candidates):
        try:
            with Image.open(path) as im:
                if im.mode not in ("RGB", "RGBA", "P") or min(im.size) < _MIN_SIDE:
                    continue
                rgb = np.asarray(im.convert("RGB"))
        except Exception:  # not an image PIL can read: skip it
            continue
        # Greyscale images saved as RGB, and flat drawings, are not photographs.
        if rgb.std(axis=2).mean() < 4 or len(np.unique(rgb[::8, ::8].reshape(-1, 3), axis=0)) < 500:
            continue
        photos.append(path)
    return photos


_decoded = {}  # per worker process: source path -> decoded RGB image


def render(args):
    """One output JPEG (bytes); a pure function of its arguments."""
    seed, photo_paths = args
    rng = np.random.default_rng(seed)
    path = photo_paths[int(rng.integers(len(photo_paths)))]
    if path not in _decoded:
        with Image.open(path) as im:
            _decoded[path] = im.convert("RGB")
    src = _decoded[path]
    w, h = src.size
    area = w * h * rng.uniform(0.10, 1.0)
    aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    cw = int(min(w, max(32, round(np.sqrt(area * aspect)))))
    ch = int(min(h, max(32, round(np.sqrt(area / aspect)))))
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    img = src.crop((x, y, x + cw, y + ch))
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    short = int(rng.integers(300, 501))
    scale = short / min(cw, ch)
    img = img.resize((max(1, round(cw * scale)), max(1, round(ch * scale))), Image.BICUBIC)
    # A small per-image colour shift, so crops of one photo differ in more than geometry.
    shift = rng.normal(0, 6, size=3)
    arr = np.clip(np.asarray(img, dtype=np.float32) + shift, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(arr).save(out, "JPEG", quality=int(rng.integers(75, 96)), subsampling=2)
    return out.getvalue()


def class_name(c):
    return "n%08d" % (1000000 + c)  # WordNet-id-like, as in ImageNet; sorted = label order


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--classes", type=int, default=50)
    p.add_argument("--images-per-class", type=int, default=256)
    p.add_argument("--shard-size", type=int, default=1000, help="samples per tar shard")
    p.add_argument("--photos", help="directory of photographs (default: skimage's and "
                   "matplotlib's sample images)")
    p.add_argument("--tokens-mb", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=os.cpu_count())
    a = p.parse_args()

    photos = find_photos(a.photos)
    if not photos:
        sys.exit("make_bench_dataset: no colour photographs found (install scikit-image or "
                 "matplotlib, or pass --photos DIR)")
    t0 = time.time()
    n = a.classes * a.images_per_class
    # Sample i belongs to class i % classes, so every shard holds every class.
    work = [(a.seed * 1000003 + i, photos) for i in range(n)]
    with multiprocessing.Pool(a.jobs) as pool:
        jpegs = pool.map(render, work, chunksize=64)

    folder = os.path.join(a.out, "imagefolder")
    for c in range(a.classes):
        os.makedirs(os.path.join(folder, class_name(c)), exist_ok=True)
    for i, data in enumerate(jpegs):
        with open(os.path.join(folder, class_name(i % a.classes), "%08d.jpg" % i), "wb") as f:
            f.write(data)

    shards = os.path.join(a.out, "shards")
    os.makedirs(shards, exist_ok=True)
    num_shards = (n + a.shard_size - 1) // a.shard_size
    for s in range(num_shards):
        with tarfile.open(os.path.join(shards, "train-%06d.tar" % s), "w",
                          format=tarfile.USTAR_FORMAT) as tar:
            for i in range(s * a.shard_size, min(n, (s + 1) * a.shard_size)):
                for ext, data in (("jpg", jpegs[i]), ("cls", b"%d" % (i % a.classes))):
                    info = tarfile.TarInfo("%08d.%s" % (i, ext))
                    info.size = len(data)
                    info.mtime = 0
                    tar.addfile(info, io.BytesIO(data))

    if a.tokens_mb:
        rng = np.random.default_rng(a.seed)
        rng.integers(0, 50257, size=a.tokens_mb * (1 << 20) // 2,
                     dtype=np.uint16).tofile(os.path.join(a.out, "tokens.u16"))

    total = sum(len(j) for j in jpegs)
    print("make_bench_dataset: %d JPEGs from %d photographs (%.1f KiB mean) in %s, "
          "%d shards, %.1f s" % (n, len(photos), total / n / 1024, a.out, num_shards,
                                 time.time() - t0))
    print("shards: %s/train-{000000..%06d}.tar" % (shards, num_shards - 1))


if __name__ == "__main__":
    main()
