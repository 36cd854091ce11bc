#!/usr/bin/env python3
"""Says whether an image folder is ImageNet-like in what costs JPEG decode time.

Reports, for every .jpg/.jpeg/.png file (any case) under FOLDER, or an evenly spread
--limit of them: file count, file size (mean, median, 10th-90th percentile), shorter and
longer side, bytes a pixel, JPEG quality (estimated from the luma quantisation table
against libjpeg's scaled standard table), chroma subsampling, the share of progressive,
grayscale, CMYK and PNG (by content, whatever the name) files, and the single-thread
decode rate of Pillow (files read into memory first, then Image.open(...).convert("RGB")
per file, as torchvision's ImageFolder loader does).

Targets printed alongside, for an ImageNet-like corpus (bench/make_bench_dataset.py
writes one): mean file 90-120 KiB (ImageNet's training set: about 110 KB a file), shorter
side 300-500 px, quality 75-95 (ImageNet itself is mostly 4:4:4 at 96: M. Ehrlich,
"Compression in the ImageNet Dataset"), a few percent progressive, grayscale and CMYK.
Single-thread Pillow decodes ImageNet's validation set at 537-726 images/s on current
server cores (AMD EPYC 9B14 537, Intel Xeon 8581C 577, AMD EPYC 9B45 726:
github.com/ternaus/imread_benchmark); the rate here is this machine's, so compare corpora
on one machine.

Needs PIL and numpy (python3-pil, python3-numpy).

  python3 bench/corpus_stats.py FOLDER [--limit 2000] [--json FILE]
"""

import argparse
import io
import json
import os
import sys
import time

try:
    import numpy as np
    from PIL import Image, JpegImagePlugin
except ImportError as e:
    sys.exit("corpus_stats: %s; it needs numpy and PIL (apt-get install python3-numpy "
             "python3-pil; run /usr/bin/python3 where python3 is another interpreter)" % e)

# libjpeg's standard luminance table (ITU T.81 Annex K), the base of the IJG qualities.
_STD_LUMA = np.array([
    16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55,
    14, 13, 16, 24, 40, 57, 69, 56, 14, 17, 22, 29, 51, 87, 80, 62,
    18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
    49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99])


def _ijg_table(quality):
    scale = 5000 // quality if quality < 50 else 200 - 2 * quality
    return np.clip((_STD_LUMA * scale + 50) // 100, 1, 255)


_TABLES = {q: np.sort(_ijg_table(q)) for q in range(1, 101)}


def estimate_quality(luma_table):
    """(quality, exact): the IJG quality whose luma table is nearest (order-free)."""
    t = np.sort(np.asarray(luma_table, dtype=np.int64))
    q = min(_TABLES, key=lambda k: (np.abs(_TABLES[k] - t).sum(), -k))
    return q, bool(np.array_equal(_TABLES[q], t))


def list_images(folder):
    paths = []
    for d, _, names in os.walk(folder):
        paths += [os.path.join(d, n) for n in names
                  if os.path.splitext(n)[1].lower() in (".jpg", ".jpeg", ".png")]
    return sorted(paths)


def describe(data):
    """One file's facts from its header (no decode)."""
    im = Image.open(io.BytesIO(data))
    w, h = im.size
    fact = {"bytes": len(data), "short": min(w, h), "long": max(w, h), "format": im.format,
            "mode": im.mode, "progressive": False, "sampling": None, "quality": None}
    if im.format == "JPEG":
        fact["progressive"] = bool(im.info.get("progressive") or im.info.get("progression"))
        fact["sampling"] = {0: "4:4:4", 1: "4:2:2", 2: "4:2:0"}.get(
            JpegImagePlugin.get_sampling(im), "other") if im.mode == "RGB" else None
        if im.quantization:
            fact["quality"], fact["quality_exact"] = estimate_quality(im.quantization[0])
    return fact


def decode_rate(blobs, min_seconds=5.0):
    """Pillow full decodes per second on this thread, over the blobs, repeated to last
    at least min_seconds (after one warm-up pass over up to 50 files)."""
    for data in blobs[:50]:
        Image.open(io.BytesIO(data)).convert("RGB")
    done, t0 = 0, time.perf_counter()
    while True:
        for data in blobs:
            Image.open(io.BytesIO(data)).convert("RGB")
        done += len(blobs)
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds:
            return done / elapsed


def pct(part, whole):
    return 100.0 * part / whole if whole else 0.0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[2:]))
    p.add_argument("folder")
    p.add_argument("--limit", type=int, default=0,
                   help="use this many files, evenly spread (default: all)")
    p.add_argument("--decode-seconds", type=float, default=5.0,
                   help="least time to spend measuring the decode rate (0: skip it)")
    p.add_argument("--json", help="also write the figures here")
    a = p.parse_args()

    paths = list_images(a.folder)
    if not paths:
        sys.exit("corpus_stats: no .jpg, .jpeg or .png files under '%s'" % a.folder)
    if a.limit and len(paths) > a.limit:
        paths = [paths[i * len(paths) // a.limit] for i in range(a.limit)]
    blobs, facts = [], []
    for path in paths:
        with open(path, "rb") as f:
            blobs.append(f.read())
        try:
            facts.append(describe(blobs[-1]))
        except Exception as e:  # noqa: BLE001 - an unreadable file is reported, not fatal
            print("corpus_stats: cannot read '%s': %s" % (path, e), file=sys.stderr)
            blobs.pop()
    n = len(facts)
    size = np.array([f["bytes"] for f in facts]) / 1024
    short = np.array([f["short"] for f in facts])
    long_ = np.array([f["long"] for f in facts])
    bpp = np.array([f["bytes"] / (f["short"] * f["long"]) for f in facts])
    jpegs = [f for f in facts if f["format"] == "JPEG"]
    qual = np.array([f["quality"] for f in jpegs if f["quality"] is not None])
    colour = [f for f in jpegs if f["sampling"]]
    res = {
        "files": n,
        "mean_kib": float(size.mean()), "median_kib": float(np.median(size)),
        "p10_kib": float(np.percentile(size, 10)), "p90_kib": float(np.percentile(size, 90)),
        "short_min": int(short.min()), "short_median": float(np.median(short)),
        "short_max": int(short.max()), "long_min": int(long_.min()),
        "long_max": int(long_.max()), "mean_megapixels": float((short * long_).mean() / 1e6),
        "bytes_per_pixel": float(bpp.mean()),
        "quality_median": float(np.median(qual)) if len(qual) else None,
        "quality_p5": float(np.percentile(qual, 5)) if len(qual) else None,
        "quality_p95": float(np.percentile(qual, 95)) if len(qual) else None,
        "quality_exact_pct": pct(sum(f.get("quality_exact", False) for f in jpegs), len(jpegs)),
        "sampling_pct": {s: pct(sum(f["sampling"] == s for f in colour), len(colour))
                         for s in ("4:4:4", "4:2:2", "4:2:0", "other")},
        "progressive_pct": pct(sum(f["progressive"] for f in jpegs), n),
        "gray_pct": pct(sum(f["mode"] == "L" for f in jpegs), n),
        "cmyk_pct": pct(sum(f["mode"] == "CMYK" for f in jpegs), n),
        "png_pct": pct(sum(f["format"] == "PNG" for f in facts), n),
        "other_pct": pct(sum(f["format"] not in ("JPEG", "PNG") for f in facts), n),
    }
    print("corpus_stats: %s, %d files%s" % (a.folder, n, " (of %d)" % len(list_images(a.folder))
                                            if a.limit else ""))
    print("  file KiB        mean %.1f, median %.1f, 10-90%% %.1f-%.1f   (target: mean 90-120)"
          % (res["mean_kib"], res["median_kib"], res["p10_kib"], res["p90_kib"]))
    print("  shorter side    %d-%d px, median %.0f; longer side %d-%d; %.3f MP mean   "
          "(target: shorter 300-500)" % (res["short_min"], res["short_max"],
                                          res["short_median"], res["long_min"],
                                          res["long_max"], res["mean_megapixels"]))
    print("  bytes/pixel     %.2f mean" % res["bytes_per_pixel"])
    if len(qual):
        print("  JPEG quality    median %.0f, 5-95%% %.0f-%.0f (IJG tables: %.0f%% exact)   "
              "(target: 75-95)" % (res["quality_median"], res["quality_p5"],
                                   res["quality_p95"], res["quality_exact_pct"]))
    print("  colour JPEGs    %s" % ", ".join("%.1f%% %s" % (v, k)
                                             for k, v in res["sampling_pct"].items() if v))
    print("  special files   %.1f%% progressive, %.1f%% grayscale, %.1f%% CMYK, %.2f%% PNG%s   "
          "(target: a few %% each; PNG rare)"
          % (res["progressive_pct"], res["gray_pct"], res["cmyk_pct"], res["png_pct"],
             ", %.1f%% other" % res["other_pct"] if res["other_pct"] else ""))
    if a.decode_seconds > 0:
        res["pil_decode_per_s"] = decode_rate(blobs, a.decode_seconds)
        print("  PIL decode      %.0f images/s, one thread, %.0f MP/s   (ImageNet val: "
              "537-726/s on server cores)" % (res["pil_decode_per_s"],
                                              res["pil_decode_per_s"] * res["mean_megapixels"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
