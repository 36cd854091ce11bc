#!/usr/bin/env python3
"""The three groups of JPEGs bench/reduced_scale_bench measures, written under OUT:

  photos/    the colour photographs Debian's python3-skimage ships (astronaut, chelsea,
             coffee, motorcycle, rocket, grace_hopper, ...), re-encoded at quality 90, at
             their own size (shorter side 300-600 px);
  detailed/  1,600 x 1,200 images of fine detail a camera records: per-pixel sensor noise
             (sigma 10 levels) over a photograph, plus fabric-like stripes of period 2-5 px in
             part of each image, quality 95;
  camera/    those photographs at 4,000 x 3,000 (a 12-megapixel camera's size), upscaled with
             Lanczos and given the same sensor noise, quality 92.

  /usr/bin/python3 bench/make_scale_corpora.py OUT [--photos DIR]

Needs numpy and PIL (python3-numpy, python3-pil) and the photographs (python3-skimage, or
--photos DIR holding them, as scripts/gpu-bundle.sh exports them)."""

import argparse
import os
import sys

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_bench_dataset  # noqa: E402


def noisy(rgb, rng, sigma=10.0):
    out = rgb.astype(np.float32) + rng.normal(0.0, sigma, rgb.shape).astype(np.float32)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def stripes(rgb, rng):
    h, w, _ = rgb.shape
    out = rgb.astype(np.float32)
    period = int(rng.integers(2, 6))
    y0, x0 = int(rng.integers(0, h // 2)), int(rng.integers(0, w // 2))
    ys, xs = slice(y0, y0 + h // 2), slice(x0, x0 + w // 2)
    phase = (np.arange(w // 2) % period) < period / 2
    out[ys, xs] += np.where(phase, 40.0, -40.0)[None, :, None]
    return np.clip(out, 0, 255).astype(np.uint8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--photos", help="a folder of the source photographs")
    args = ap.parse_args()
    sources = make_bench_dataset.find_sources(args.photos)["colour"]
    if not sources:
        sys.exit("make_scale_corpora: no photographs found (apt-get install python3-skimage)")
    rng = np.random.default_rng(2026)
    for group in ("photos", "detailed", "camera"):
        os.makedirs(os.path.join(args.out, group), exist_ok=True)
    for i, path in enumerate(sources):
        name = os.path.splitext(os.path.basename(path))[0]
        with Image.open(path) as im:
            photo = im.convert("RGB")
        photo.save(os.path.join(args.out, "photos", name + ".jpg"), quality=90)
        big = np.asarray(photo.resize((1600, 1200), Image.LANCZOS))
        Image.fromarray(stripes(noisy(big, rng), rng)).save(
            os.path.join(args.out, "detailed", name + ".jpg"), quality=95)
        camera = np.asarray(photo.resize((4000, 3000), Image.LANCZOS))
        Image.fromarray(noisy(camera, rng)).save(
            os.path.join(args.out, "camera", name + ".jpg"), quality=92)
    print("make_scale_corpora: %d photographs in %s/{photos,detailed,camera}"
          % (len(sources), args.out))


if __name__ == "__main__":
    main()
