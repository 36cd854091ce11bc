#!/usr/bin/python3
"""Writes a synthetic, ImageNet-like dataset for ferry's demo and benchmarks.

Images: an imagefolder tree root/<class>/<class>_<n>.jpg of N classes x M JPEGs. Each
image has its own size (shorter side 300-500 px, aspect 3:4 to 16:9, either
orientation), a smooth colourful background, soft shapes and a little sensor-like
noise, saved at quality 75-95, so they cost bytes and decode time of the same order as
photos (mean ~70 KiB per file; ImageNet's training JPEGs average ~110 KB at similar
sizes). Each class has its own dominant hue, so labels mean something to the eye.

Tokens: with --tokens, a flat little-endian uint16 file of token ids (the `tokens`
dataset format), Zipf-distributed like natural text.

Everything is deterministic from --seed: the same arguments give the same bytes.

  /usr/bin/python3 examples/make_demo_dataset.py build/demo/imagenet --classes 10 \
      --images-per-class 100
  /usr/bin/python3 examples/make_demo_dataset.py --tokens build/demo/tokens.u16 \
      --num-tokens 10000000

Needs numpy and PIL (Debian: python3-numpy python3-pil).
"""

import argparse
import io
import multiprocessing
import os
import sys
import time

import numpy as np
from PIL import Image, ImageDraw, ImageFilter


def class_name(c):
    # WordNet-id-like names, as in ImageNet (n01440764, ...); sorted order = label order.
    return "n%08d" % (1000000 + c)


def render_image(seed, cls, num_classes):
    """Returns (JPEG bytes, (width, height)) for one image; pure function of its args."""
    rng = np.random.default_rng(seed)
    short = int(rng.integers(300, 501))
    aspect = float(rng.uniform(4 / 3, 16 / 9)) if rng.random() < 0.8 else float(rng.uniform(1.0, 4 / 3))
    long = int(round(short * aspect))
    w, h = (long, short) if rng.random() < 0.75 else (short, long)

    # Smooth background: a tiny random colour field blown up with bicubic interpolation,
    # tinted towards the class's hue.
    hue = cls / max(num_classes, 1)
    tint = np.array(_hsv_to_rgb(hue, 0.7, 0.9)) * 255.0
    gw, gh = int(rng.integers(3, 7)), int(rng.integers(3, 7))
    grid = rng.uniform(0, 255, size=(gh, gw, 3)) * 0.55 + tint * 0.45
    img = Image.fromarray(grid.astype(np.uint8), "RGB").resize((w, h), Image.BICUBIC)

    # Shapes: ellipses, rectangles and polygons in related colours, then a blur so the
    # edges are soft like out-of-focus objects.
    draw = ImageDraw.Draw(img, "RGBA")
    for _ in range(int(rng.integers(4, 12))):
        kind = rng.integers(0, 3)
        colour = tuple(int(v) for v in np.clip(tint * rng.uniform(0.3, 1.2) +
                                               rng.normal(0, 50, 3), 0, 255))
        fill = colour + (int(rng.integers(90, 230)),)
        x0, y0 = int(rng.integers(-w // 4, w)), int(rng.integers(-h // 4, h))
        x1 = x0 + int(rng.integers(w // 10, w // 2))
        y1 = y0 + int(rng.integers(h // 10, h // 2))
        if kind == 0:
            draw.ellipse((x0, y0, x1, y1), fill=fill)
        elif kind == 1:
            draw.rectangle((x0, y0, x1, y1), fill=fill)
        else:
            pts = [(int(rng.integers(x0, x1)), int(rng.integers(y0, y1))) for _ in range(5)]
            draw.polygon(pts, fill=fill)
    img = img.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.8, 2.5))))

    # Texture: a few sinusoidal stripes and fine noise give the high frequencies that make
    # real photos cost bytes; without them the JPEGs would be unrealistically small.
    pixels = np.asarray(img, dtype=np.float32)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    freq = rng.uniform(0.02, 0.15)
    angle = rng.uniform(0, np.pi)
    stripes = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * freq)
    pixels += stripes[..., None] * rng.uniform(4, 14)
    # Mid-frequency texture (foliage, fabric, fur): noise at half the resolution.
    tex = rng.normal(0, 1, size=(h // 2 + 1, w // 2 + 1)).astype(np.float32)
    tex = np.asarray(Image.fromarray(tex, "F").resize((w, h), Image.BILINEAR))
    pixels += tex[..., None] * rng.uniform(14, 30)
    pixels += rng.normal(0, rng.uniform(4, 10), size=pixels.shape).astype(np.float32)
    img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")

    out = io.BytesIO()
    img.save(out, "JPEG", quality=int(rng.integers(75, 96)))
    return out.getvalue(), (w, h)


def _hsv_to_rgb(h, s, v):
    i = int(h * 6) % 6
    f = h * 6 - int(h * 6)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    return [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i]


def _write_one(job):
    path, seed, cls, num_classes = job
    data, _ = render_image(seed, cls, num_classes)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)  # a killed run never leaves a truncated JPEG behind
    return len(data)


def write_images(root, num_classes, per_class, seed, workers):
    jobs = []
    for c in range(num_classes):
        d = os.path.join(root, class_name(c))
        os.makedirs(d, exist_ok=True)
        for i in range(per_class):
            # One independent stream per image, so the output does not depend on the
            # number of workers or on scheduling.
            image_seed = np.random.SeedSequence([seed, c, i]).generate_state(1)[0]
            jobs.append((os.path.join(d, "%s_%06d.jpg" % (class_name(c), i)),
                         int(image_seed), c, num_classes))
    start = time.monotonic()
    if workers <= 1:
        sizes = [_write_one(j) for j in jobs]
    else:
        with multiprocessing.Pool(workers) as pool:
            sizes = pool.map(_write_one, jobs, chunksize=8)
    elapsed = time.monotonic() - start
    total = sum(sizes)
    print("wrote %d JPEGs (%d classes x %d) to %s: %.1f MiB, mean %.0f KiB/image, "
          "%.1f s (%d workers)" % (len(jobs), num_classes, per_class, root,
                                  total / 2**20, total / max(len(jobs), 1) / 1024,
                                  elapsed, max(workers, 1)))


def write_tokens(path, num_tokens, vocab, seed):
    if vocab > 65536:
        sys.exit("--vocab %d does not fit uint16 (at most 65536)" % vocab)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x70C3]))
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    start = time.monotonic()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        left = num_tokens
        while left > 0:
            n = min(left, 1 << 22)
            # Zipf ranks folded into the vocabulary: a few very common ids, a long tail.
            ids = (rng.zipf(1.2, size=n) - 1) % vocab
            f.write(ids.astype("<u2").tobytes())
            left -= n
    os.replace(tmp, path)
    print("wrote %d uint16 tokens (vocab %d) to %s: %.1f MiB, %.1f s" %
          (num_tokens, vocab, path, num_tokens * 2 / 2**20, time.monotonic() - start))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("root", nargs="?", help="imagefolder root to write (omit for tokens only)")
    p.add_argument("--classes", type=int, default=10, help="number of classes (default 10)")
    p.add_argument("--images-per-class", type=int, default=100,
                   help="JPEGs per class (default 100)")
    p.add_argument("--seed", type=int, default=0, help="seed; same seed, same bytes")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="processes (default: one per CPU)")
    p.add_argument("--tokens", metavar="PATH", help="also write a uint16 token file here")
    p.add_argument("--num-tokens", type=int, default=10_000_000,
                   help="tokens to write with --tokens (default 10M)")
    p.add_argument("--vocab", type=int, default=50257,
                   help="token ids are in [0, vocab) (default 50257, GPT-2's)")
    args = p.parse_args()
    if args.root is None and args.tokens is None:
        p.error("give an imagefolder root, --tokens PATH, or both")
    if args.classes < 1 or args.images_per_class < 1 or args.num_tokens < 1:
        p.error("--classes, --images-per-class and --num-tokens must be at least 1")
    if args.root is not None:
        write_images(args.root, args.classes, args.images_per_class, args.seed, args.workers)
    if args.tokens is not None:
        write_tokens(args.tokens, args.num_tokens, args.vocab, args.seed)


if __name__ == "__main__":
    main()
