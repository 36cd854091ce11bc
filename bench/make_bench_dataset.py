#!/usr/bin/env python3
"""Writes the benchmark dataset: an ImageNet-like JPEG corpus in what costs decode time.

What a JPEG costs to decode depends on its pixels (IDCT, upsampling, colour conversion)
and on its entropy-coded bytes (Huffman decoding of every nonzero DCT coefficient).
Smooth images, or small photographs scaled up, have few nonzero coefficients and decode
much faster than ImageNet's camera photographs, so this script makes files of ImageNet's
size and byte density from real photographic texture:

  - sources: the photographs that Debian's python3-skimage ships (astronaut, chelsea,
    coffee, ihc, motorcycle_left/right, retina, rocket in colour; camera, moon, coins,
    cell in gray; the textures brick, grass, gravel) and matplotlib's grace_hopper.jpg
    where installed, or every photograph under --photos DIR;
  - each image is a collage (one to six regions) of random crops of random sources at
    random scales (mostly scaled down, which keeps the sources' detail dense), flips,
    quarter turns and small rotations, with a colour shift (saturation, gain, offset,
    gamma), the high-pass detail of a real texture photograph (grass, gravel, brick)
    over all of it with a smoothly varying strength, and sensor grain (luma and weaker
    chroma noise, slightly correlated as after demosaicing);
  - geometry: shorter side 300-500 px, the longer side from ImageNet-like aspect ratios
    (4:3 and 3:2 landscape, 3:4 and 2:3 portrait, square, a few 5:4, 16:9 and 2:1); half
    the files have a longer side of 500 px (clipped to the 300 px shorter side), as
    ImageNet's Flickr downloads mostly do;
  - encoding (Pillow, libjpeg-turbo): quality 75-95 (70% at 91-95); chroma 4:2:0 for
    55%, 4:4:4 for 42%, 4:2:2 for 3%; about 3% progressive, 2% grayscale (one
    component), 1% CMYK (Adobe marker); and --png files (default 1) that are PNGs named
    .JPEG, as ImageNet's n02105855_2933.JPEG is.

Targets (bench/corpus_stats.py reports them for any folder): mean file 90-120 KiB
(ImageNet's training set: about 110 KB a file over 1.28 M files) at 0.5-0.9 bytes a
pixel. ImageNet itself is mostly 4:4:4 at quality 96 (M. Ehrlich, "Compression in the
ImageNet Dataset"), which is where its byte density comes from; this corpus reaches a
similar density within its quality range of 75-95. Single-thread Pillow decodes
ImageNet's validation JPEGs at 537-726 images/s on current server cores
(github.com/ternaus/imread_benchmark); corpus_stats.py measures the same rate here.

Layouts written under OUT:
  OUT/imagefolder/<class>/<class>_<n>.JPEG   ImageFolder: --classes folders (label =
                                             sorted position); image n is in class n % C
  OUT/shards/train-000000.tar ...            WebDataset shards of the same files in the
                                             same order: <key>.jpg + <key>.cls (label)
  OUT/tokens.u16                             with --tokens-mb: uniform random uint16 ids

Deterministic for a --seed and set of sources, whatever --jobs. Needs numpy and PIL
(python3-numpy, python3-pil) and, for the default sources, python3-skimage's
photographs (apt-get install python3-skimage; only its data files are read, so an
installation whose skimage module cannot be imported serves too). Costs about 15 CPU-ms
an image: 12,800 in about 1.5-3 minutes on 2 cores.

  python3 bench/make_bench_dataset.py OUT --images 12800 --classes 50 [--seed 0]
  python3 bench/corpus_stats.py OUT/imagefolder
"""

import argparse
import glob
import importlib.util
import io
import multiprocessing
import os
import shutil
import sys
import tarfile
import time

try:
    import numpy as np
    from PIL import Image, ImageEnhance, ImageFilter
except ImportError as e:
    sys.exit("make_bench_dataset: %s; it needs numpy and PIL (apt-get install python3-numpy "
             "python3-pil; run /usr/bin/python3 where python3 is another interpreter)" % e)

# The default sources, by file name, in skimage/data (Debian: python3-skimage) and
# matplotlib's mpl-data/sample_data.
COLOUR = ("astronaut.png", "chelsea.png", "coffee.png", "ihc.png", "motorcycle_left.png",
          "motorcycle_right.png", "retina.jpg", "rocket.jpg", "grace_hopper.jpg")
GRAY = ("camera.png", "moon.png", "coins.png", "cell.png")  # tinted regions
TEXTURE = ("brick.png", "grass.png", "gravel.png")          # detail over the picture

_MIN_SIDE = 256  # sources smaller than this are not photographs worth cropping
_BANK = 1024     # side of the precomputed grain and texture-detail tiles


def _data_dirs():
    """skimage's and matplotlib's sample-data folders, found without importing either."""
    roots = []
    for module in ("skimage", "matplotlib"):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        roots += [(module, r) for r in (spec.submodule_search_locations or [])] if spec else []
        roots.append((module, os.path.join("/usr/lib/python3/dist-packages", module)))
    dirs = []
    for module, root in roots:
        d = os.path.join(root, "data" if module == "skimage" else "mpl-data/sample_data")
        if os.path.isdir(d) and d not in dirs:
            dirs.append(d)
    if os.path.isdir("/usr/share/matplotlib/mpl-data/sample_data"):
        dirs.append("/usr/share/matplotlib/mpl-data/sample_data")
    return dirs


def find_sources(photos_dir):
    """{'colour': [...], 'gray': [...], 'texture': [...]}: source paths. The default
    sources (by name, from photos_dir or the data folders) come first in a fixed order,
    so a folder written by --export-photos gives the same corpus as the data folders."""
    if photos_dir:
        paths = []
        for ext in ("jpg", "jpeg", "png", "JPG", "JPEG", "PNG"):
            paths += glob.glob(os.path.join(photos_dir, "**", "*." + ext), recursive=True)
        paths = sorted(set(paths))
    else:
        paths = [os.path.join(d, n) for d in _data_dirs() for n in COLOUR + GRAY + TEXTURE
                 if os.path.isfile(os.path.join(d, n))]
    known = {n: (kind, i) for kind, names in (("colour", COLOUR), ("gray", GRAY),
                                              ("texture", TEXTURE)) for i, n in enumerate(names)}
    found = {"colour": {}, "gray": {}, "texture": {}}
    for path in paths:
        name = os.path.basename(path)
        if name in known:
            kind, rank = known[name]
            found[kind].setdefault((0, rank), path)  # the first folder's copy
            continue
        try:
            with Image.open(path) as im:
                if min(im.size) < _MIN_SIDE:
                    continue
                rgb = np.asarray(im.convert("RGB"))
        except Exception:  # not an image PIL can read: skip it
            continue
        # Drawings and flat images are not photographs.
        if rgb.std() < 20 or len(np.unique(rgb[::4, ::4].reshape(-1, 3), axis=0)) < 200:
            continue
        gray = int(np.abs(rgb.astype(np.int16) - rgb[..., :1]).max()) < 8
        found["gray" if gray else "colour"][(1, path)] = path
    return {kind: [found[kind][k] for k in sorted(found[kind])] for kind in found}


# ---------------------------------------------------------------- in each worker process

_src = None  # set by _init: the decoded sources and the precomputed banks


def _init(sources, seed):
    """Decodes the sources and builds the banks, once per worker (deterministic)."""
    global _src
    colour = [Image.open(p).convert("RGB") for p in sources["colour"]]
    gray = [Image.open(p).convert("L") for p in sources["gray"]]
    rng = np.random.default_rng([seed, 0x6A7A])
    # Sensor grain: unit-variance noise, its neighbours mixed in a little (demosaicing
    # correlates them). Three planes: luma and two chroma.
    grain = rng.standard_normal((3, _BANK, _BANK), dtype=np.float32)
    for c in range(3):
        g = grain[c]
        grain[c] = (g + 0.25 * (np.roll(g, 1, 0) + np.roll(g, 1, 1))) / np.sqrt(1.125)
    # Real texture detail: each texture photograph's high-pass (minus its blur) at two
    # scales, tiled mirrored up to the bank size, at unit variance.
    detail = []
    for p in sources["texture"] or sources["gray"]:
        im = Image.open(p).convert("L")
        for scale in (1.0, 0.6):
            t = im if scale == 1.0 else im.resize(
                (int(im.width * scale), int(im.height * scale)), Image.LANCZOS)
            hp = (np.asarray(t, np.float32)
                  - np.asarray(t.filter(ImageFilter.GaussianBlur(2.5)), np.float32))
            reps = (-(-_BANK // hp.shape[0]), -(-_BANK // hp.shape[1]))
            tile = np.block([[hp if (i + j) % 2 == 0 else hp[::-1, ::-1]
                              for j in range(reps[1])] for i in range(reps[0])])
            tile = tile[:_BANK, :_BANK]
            detail.append((tile / max(float(tile.std()), 1e-3)).astype(np.float32))
    _src = {"colour": colour, "gray": gray, "grain": grain, "detail": detail}


def _bank_window(rng, bank, h, w):
    """An h x w window of a bank tile at a random offset."""
    if h > bank.shape[-2] or w > bank.shape[-1]:
        reps = (1,) * (bank.ndim - 2) + (-(-h // bank.shape[-2]), -(-w // bank.shape[-1]))
        bank = np.tile(bank, reps)
    y = int(rng.integers(0, bank.shape[-2] - h + 1))
    x = int(rng.integers(0, bank.shape[-1] - w + 1))
    return bank[..., y:y + h, x:x + w]


def _fill(rng, w, h):
    """A w x h RGB region: a crop of a random source, scaled, flipped and turned."""
    use_gray = bool(_src["gray"]) and rng.random() < 0.12
    pool = _src["gray"] if use_gray else _src["colour"]
    src = pool[int(rng.integers(len(pool)))]
    turn = int(rng.choice(4, p=(0.7, 0.1, 0.1, 0.1)))  # quarter turns
    tw, th = (h, w) if turn % 2 else (w, h)             # the region in the source's frame
    # Output pixels per source pixel: mostly below 1 (scaled down: dense detail).
    scale = float(np.exp(rng.uniform(np.log(0.3), np.log(1.0))))
    scale = max(scale, tw / src.width, th / src.height)
    cw, ch = min(src.width, round(tw / scale)), min(src.height, round(th / scale))
    x, y = int(rng.integers(0, src.width - cw + 1)), int(rng.integers(0, src.height - ch + 1))
    angle = rng.uniform(-12, 12) if rng.random() < 0.15 else 0.0
    img = src.crop((x, y, x + cw, y + ch))
    if angle:
        # Scaled to k times the region, turned about the centre, and cut to the region:
        # no corner is left empty.
        c, s = abs(np.cos(np.radians(angle))), abs(np.sin(np.radians(angle)))
        k = max(c + s * th / tw, c + s * tw / th)
        big = img.resize((round(tw * k) + 2, round(th * k) + 2), Image.BICUBIC)
        big = big.rotate(angle, Image.BILINEAR)
        mx, my = (big.width - tw) // 2, (big.height - th) // 2
        img = big.crop((mx, my, mx + tw, my + th))
    else:
        img = img.resize((tw, th), Image.BICUBIC)
    if turn:
        img = img.transpose((None, Image.ROTATE_90, Image.ROTATE_180, Image.ROTATE_270)[turn])
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    if use_gray:  # a tinted gray photograph
        tint = rng.uniform(0.75, 1.0, size=3).astype(np.float32)
        img = Image.fromarray((np.asarray(img.convert("RGB"), np.float32) * tint).astype(np.uint8))
    return img


# (aspect, weight): landscape and portrait photographs, a few squares and panoramas.
_ASPECTS = ((4 / 3, 0.42), (3 / 2, 0.12), (3 / 4, 0.18), (2 / 3, 0.07), (1.0, 0.11),
            (16 / 9, 0.05), (2.0, 0.03), (5 / 4, 0.02))


def _geometry(rng):
    """(width, height): shorter side 300-500, ImageNet-like aspect ratios."""
    weights = np.array([p for _, p in _ASPECTS])
    aspect = _ASPECTS[int(rng.choice(len(_ASPECTS), p=weights / weights.sum()))][0]
    aspect *= rng.uniform(0.97, 1.03)
    wide = max(aspect, 1 / aspect)
    short = 500 / wide if rng.random() < 0.5 else rng.uniform(300, 500)
    short = int(np.clip(round(short), 300, 500))
    long_ = int(round(short * wide))
    return (long_, short) if aspect >= 1 else (short, long_)


def _compose(rng, w, h):
    """The picture: one region, two, an irregular grid, or one with an inset."""
    layout = int(rng.choice(4, p=(0.5, 0.27, 0.13, 0.10)))
    if layout == 0:
        return _fill(rng, w, h)
    if layout == 3:
        canvas = _fill(rng, w, h)
        iw, ih = int(w * rng.uniform(0.25, 0.5)), int(h * rng.uniform(0.25, 0.5))
        canvas.paste(_fill(rng, iw, ih),
                     (int(rng.integers(0, w - iw)), int(rng.integers(0, h - ih))))
        return canvas
    if layout == 1:  # two regions, side by side or stacked
        if rng.random() < 0.5:
            xs, ys = [0, int(w * rng.uniform(0.3, 0.7)), w], [0, h]
        else:
            xs, ys = [0, w], [0, int(h * rng.uniform(0.3, 0.7)), h]
    else:  # 2 x 2 or 3 x 2
        cols = int(rng.integers(2, 4))
        xs = [0] + sorted(int(v) for v in rng.uniform(0.2, 0.8, cols - 1) * w) + [w]
        ys = [0, int(h * rng.uniform(0.3, 0.7)), h]
    canvas = Image.new("RGB", (w, h))
    for i in range(len(ys) - 1):
        for j in range(len(xs) - 1):
            rw, rh = xs[j + 1] - xs[j], ys[i + 1] - ys[i]
            if rw > 0 and rh > 0:
                canvas.paste(_fill(rng, rw, rh), (xs[j], ys[i]))
    return canvas


def _develop(rng, img):
    """Colour shift, texture detail and sensor grain: the per-image 'camera'."""
    w, h = img.size
    # Colour: saturation, then per-channel gain, offset and gamma through one table.
    img = ImageEnhance.Color(img).enhance(rng.uniform(0.7, 1.3))
    gain, offset = rng.normal(1.0, 0.06, 3), rng.normal(0, 6, 3)
    gamma = rng.uniform(0.85, 1.15)
    x = np.arange(256)
    table = np.concatenate([255 * (np.clip(x * gain[c] + offset[c], 0, 255) / 255) ** gamma
                            for c in range(3)])
    img = img.point(np.round(table).astype(int).tolist())
    # Luma noise: real texture detail, its strength varying smoothly over the picture,
    # and sensor grain; weaker chroma grain on red and blue.
    sigma = np.float32(np.exp(rng.normal(np.log(7.5), 0.3)))
    grain = _bank_window(rng, _src["grain"], h, w)
    noise = sigma * grain[0] + np.float32(0.5)
    if _src["detail"] and rng.random() < 0.8:
        tex = _src["detail"][int(rng.integers(len(_src["detail"])))]
        mask = Image.fromarray((rng.random((3, 4)) * 255).astype(np.uint8))
        mask = np.asarray(mask.resize((w, h), Image.BICUBIC), np.float32)
        amount = np.float32(rng.uniform(8, 22)) * (0.3 + (0.7 / 255) * mask)
        noise += _bank_window(rng, tex, h, w) * amount
    planes = []
    for c, chroma in enumerate((grain[1], None, grain[2])):
        p = np.asarray(img.getchannel(c), np.float32) + noise
        if chroma is not None:
            p += (sigma / 2) * chroma
        planes.append(Image.fromarray(np.clip(p, 0, 255, out=p).astype(np.uint8)))
    return Image.merge("RGB", planes)


def render(args):
    """Writes image n to path, a pure function of (seed, n, png). Returns (bytes, kind)."""
    seed, n, path, png = args
    rng = np.random.default_rng([seed, n])
    w, h = _geometry(rng)
    img = _develop(rng, _compose(rng, w, h))
    u = rng.random()
    quality = int(rng.integers(91, 96)) if rng.random() < 0.7 else int(rng.integers(75, 91))
    subsampling = int(rng.choice(3, p=(0.42, 0.03, 0.55)))  # 4:4:4, 4:2:2, 4:2:0
    kw = {"quality": quality, "subsampling": subsampling}
    kind = "baseline"
    if png:
        kind = "png"
    elif u < 0.02:
        img, kind = img.convert("L"), "gray"
    elif u < 0.03:
        img, kind = img.convert("CMYK"), "cmyk"
        kw["subsampling"] = 0
    elif u < 0.06:
        kw["progressive"], kind = True, "progressive"
    out = io.BytesIO()
    if png:
        img.save(out, "PNG")
    else:
        img.save(out, "JPEG", **kw)
    with open(path, "wb") as f:
        f.write(out.getvalue())
    return out.tell(), kind


def class_name(c):
    return "n%08d" % (1000000 + c)  # WordNet-id-like, as in ImageNet; sorted = label order


def image_path(folder, n, classes):
    c = class_name(n % classes)
    return os.path.join(folder, c, "%s_%d.JPEG" % (c, n))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[2:]))
    p.add_argument("out", nargs="?")
    p.add_argument("--images", type=int, help="total images (default 12,800)")
    p.add_argument("--classes", type=int, default=50)
    p.add_argument("--images-per-class", type=int,
                   help="instead of --images: images = classes x this")
    p.add_argument("--png", type=int, default=1, help="PNGs named .JPEG among the images")
    p.add_argument("--shard-size", type=int, default=1000, help="samples per tar shard")
    p.add_argument("--no-shards", action="store_true", help="write imagefolder/ only")
    p.add_argument("--photos", help="folder of photographs (default: python3-skimage's)")
    p.add_argument("--export-photos", metavar="DIR",
                   help="copy the default sources into DIR (for --photos elsewhere), exit")
    p.add_argument("--tokens-mb", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    a = p.parse_args()

    sources = find_sources(a.photos)
    if not sources["colour"]:
        where = ("under --photos '%s'" % a.photos if a.photos else
                 "in skimage's or matplotlib's data folders (%s)" % (", ".join(_data_dirs()) or
                                                                   "none found"))
        sys.exit("make_bench_dataset: no colour photographs %s; install them with "
                 "'apt-get install python3-skimage' or pass --photos DIR" % where)
    if a.export_photos:
        os.makedirs(a.export_photos, exist_ok=True)
        paths = sources["colour"] + sources["gray"] + sources["texture"]
        for path in paths:
            shutil.copy(path, a.export_photos)
        print("make_bench_dataset: %d source images in %s" % (len(paths), a.export_photos))
        return
    if not a.out:
        p.error("OUT is required")
    if a.images is not None and a.images_per_class is not None:
        p.error("give --images or --images-per-class, not both")
    n = a.images if a.images is not None else (
        a.classes * a.images_per_class if a.images_per_class is not None else 12800)
    if n < 1 or a.classes < 1:
        p.error("--images and --classes must be positive")

    t0 = time.time()
    folder = os.path.join(a.out, "imagefolder")
    for c in range(min(a.classes, n)):
        os.makedirs(os.path.join(folder, class_name(c)), exist_ok=True)
    rng = np.random.default_rng([a.seed, 0x9E6])
    pngs = set(rng.choice(n, min(a.png, n), replace=False).tolist())
    work = [(a.seed, i, image_path(folder, i, a.classes), i in pngs) for i in range(n)]
    with multiprocessing.Pool(a.jobs, _init, (sources, a.seed)) as pool:
        results = pool.map(render, work, chunksize=16)
    gen_s = time.time() - t0

    num_shards = 0
    if not a.no_shards:
        shards = os.path.join(a.out, "shards")
        os.makedirs(shards, exist_ok=True)
        num_shards = (n + a.shard_size - 1) // a.shard_size
        for s in range(num_shards):
            with tarfile.open(os.path.join(shards, "train-%06d.tar" % s), "w",
                              format=tarfile.USTAR_FORMAT) as tar:
                for i in range(s * a.shard_size, min(n, (s + 1) * a.shard_size)):
                    with open(work[i][2], "rb") as f:
                        data = f.read()
                    for ext, blob in (("jpg", data), ("cls", b"%d" % (i % a.classes))):
                        info = tarfile.TarInfo("%08d.%s" % (i, ext))
                        info.size = len(blob)
                        info.mtime = 0
                        tar.addfile(info, io.BytesIO(blob))

    if a.tokens_mb:
        rng = np.random.default_rng(a.seed)
        rng.integers(0, 50257, size=a.tokens_mb * (1 << 20) // 2,
                     dtype=np.uint16).tofile(os.path.join(a.out, "tokens.u16"))

    sizes = np.array([r[0] for r in results])
    kinds = [r[1] for r in results]
    special = ", ".join("%d %s" % (kinds.count(k), k)
                        for k in ("progressive", "gray", "cmyk", "png") if kinds.count(k))
    print("make_bench_dataset: %d images (%s) from %d photographs and %d textures, "
          "%.1f KiB mean, %.1f KiB median, in %s; %d shards; %.1f s (%.0f images/s on %d jobs)"
          % (n, special or "all baseline JPEG", len(sources["colour"]) + len(sources["gray"]),
             len(sources["texture"]), sizes.mean() / 1024, np.median(sizes) / 1024, a.out,
             num_shards, time.time() - t0, n / gen_s, a.jobs))
    if num_shards:
        print("shards: %s/train-{000000..%06d}.tar" % (shards, num_shards - 1))


if __name__ == "__main__":
    main()
