#!/usr/bin/python3
"""Writes the fuzzers' seed corpora (fuzz/corpus/<fuzzer>/), small valid inputs of each
format for the fuzzers to mutate. Run again only to change the seeds; the files are checked
in so that every CI run starts from the same corpus.

    /usr/bin/python3 fuzz/make_corpus.py   # Debian python3-numpy, python3-pil
"""
import io
import json
import os
import struct
import sys
import tarfile

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testing"))
import png_writer  # noqa: E402
JOBSPEC_ROOT = "/tmp/ferry-fuzz-jobspec"  # jobspec_fuzzer.cc's kRoot


def put(fuzzer, name, data):
    d = os.path.join(HERE, "corpus", fuzzer)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def photo(w, h, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 7 + seed) % 256, (y * 5) % 256, ((x + y) * 3) % 256], -1)
    noise = rng.integers(0, 40, (h, w, 3))
    return Image.fromarray(((base + noise) % 256).astype(np.uint8))


def jpeg(img, **kw):
    out = io.BytesIO()
    img.save(out, "JPEG", **kw)
    return out.getvalue()


def tar(members, fmt=tarfile.USTAR_FORMAT):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def main():
    jpegs = {
        "baseline": jpeg(photo(40, 30, 1), quality=75),
        "progressive": jpeg(photo(33, 17, 2), quality=60, progressive=True),
        "gray": jpeg(photo(24, 24, 3).convert("L"), quality=80),
        "subsampled444": jpeg(photo(16, 40, 4), quality=90, subsampling=0),
        "cmyk": jpeg(photo(20, 12, 5).convert("CMYK"), quality=70),
    }
    for i, (name, data) in enumerate(jpegs.items()):
        put("image_transform_fuzzer", name, bytes([16 + i, i, 8, i]) + data)
        put("jpeg_header_fuzzer", name, data)

    # PNGs of several types (png_writer: PIL cannot write 16-bit RGB or interlaced files),
    # and JPEG and PNG with an EXIF orientation (byte 1 bit 2 turns exif_orientation on).
    rng = np.random.default_rng(7)

    def pixels(w, h, channels, depth):
        return rng.integers(0, 1 << depth, (h, w, channels)).tolist()

    pw = png_writer
    pngs = {
        "png_rgb8": pw.encode_png(20, 12, pw.COLOR_RGB, 8, pixels(20, 12, 3, 8)),
        "png_rgba16_interlaced": pw.encode_png(11, 9, pw.COLOR_RGBA, 16, pixels(11, 9, 4, 16),
                                               interlace=True),
        "png_gray16": pw.encode_png(9, 5, pw.COLOR_GRAY, 16, pixels(9, 5, 1, 16)),
        "png_gray2_interlaced": pw.encode_png(13, 7, pw.COLOR_GRAY, 2, pixels(13, 7, 1, 2),
                                              interlace=True),
        "png_palette4_trns": pw.encode_png(10, 6, pw.COLOR_PALETTE, 4, pixels(10, 6, 1, 4),
                                           palette=[(i * 16, 255 - i * 16, 7) for i in range(16)],
                                           trns=bytes([0, 128])),
        "png_gray_alpha8_exif6": pw.encode_png(8, 12, pw.COLOR_GRAY_ALPHA, 8,
                                               pixels(8, 12, 2, 8),
                                               exif=pw.exif_orientation_block(6, True)),
    }
    for i, (name, data) in enumerate(pngs.items()):
        put("image_transform_fuzzer", name, bytes([8 + i, 4 | (i & 3), 5, i]) + data)
    exif_jpeg = jpeg(photo(24, 16, 6), quality=80,
                     exif=b"Exif\0\0" + pw.exif_orientation_block(8))
    put("image_transform_fuzzer", "jpeg_exif8", bytes([12, 4, 3, 1]) + exif_jpeg)

    # compose_fuzzer: chains of ops (compose_fuzzer.cc's layout) on small images; the
    # panorama declares 1 x 65,500 pixels in its frame header (the scan is then cut short).
    def op(kind, size=0, pad=0, flags=0, p=50):
        return bytes([kind, size & 0xff, (size >> 8) & 0xff, pad, flags, p])

    RRC, RESIZE, CENTER, RANDOM_CROP, HFLIP, JITTER, NORMALIZE, ERASING = 0, 1, 2, 3, 4, 6, 9, 10
    panorama = bytearray(jpegs["baseline"])
    sof = panorama.index(b"\xff\xc0")
    panorama[sof + 5:sof + 9] = struct.pack(">HH", 65500, 1)
    chains = {
        "resize_center": (1, [op(RESIZE, 255), op(CENTER, 223)], jpegs["baseline"]),
        "rrc_jitter_normalize": (2 | 4, [op(RRC, 31), op(JITTER), op(NORMALIZE)],
                                 jpegs["subsampled444"]),
        "random_crop_reflect": (1, [op(RANDOM_CROP, 31, 4, 0x0f | (2 << 5)), op(HFLIP)],
                                pngs["png_rgb8"]),
        "panorama_resize": (1, [op(RESIZE, 4095), op(RANDOM_CROP, 223)], bytes(panorama)),
        "pad_if_needed_erasing": (2 | 8, [op(RANDOM_CROP, 63, 0, 16), op(NORMALIZE),
                                          op(ERASING, p=100)], exif_jpeg),
    }
    for name, (first, steps, image) in chains.items():
        assert first & 3 == len(steps) - 1
        put("compose_fuzzer", name, bytes([first]) + b"".join(steps) + image)

    put("exif_fuzzer", "tiff_le", pw.exif_orientation_block(3))
    put("exif_fuzzer", "tiff_be", pw.exif_orientation_block(6, big_endian=True))
    put("exif_fuzzer", "jpeg", exif_jpeg)
    put("exif_fuzzer", "png", pngs["png_gray_alpha8_exif6"])
    put("exif_fuzzer", "png_after_idat",
        pw.encode_png(2, 2, pw.COLOR_GRAY, 8, [[(1,), (2,)], [(3,), (4,)]],
                      exif=pw.exif_orientation_block(5), exif_after_idat=True))

    put("tar_index_fuzzer", "ustar", tar([("a/x.jpg", b"x" * 700), ("a/x.cls", b"3")]))
    put("tar_index_fuzzer", "gnu_long_name",
        tar([("d/" + "n" * 150 + ".jpg", b"y" * 10)], tarfile.GNU_FORMAT))
    put("tar_index_fuzzer", "pax", tar([("p/\u00e9t\u00e9.jpg", b"z" * 513)], tarfile.PAX_FORMAT))
    put("tar_index_fuzzer", "empty", tar([]))

    put("webdataset_fuzzer", "two_samples",
        tar([("s/0001.jpg", jpegs["baseline"]), ("s/0001.cls", b"1"),
             ("s/0002.jpg", jpegs["gray"]), ("s/0002.cls", b"7")]))
    put("webdataset_fuzzer", "unlabelled_and_extra",
        tar([("s/0003.jpg", jpegs["progressive"]), ("s/0003.txt", b"caption"),
             ("s/0004.JPG", jpegs["cmyk"]), ("s/0004.cls", b" 12\n")], tarfile.PAX_FORMAT))

    for name, arr in {"f4": np.zeros((3, 4), "<f4"), "i8": np.arange(5, dtype="<i8"),
                      "u2_fortran": np.asfortranarray(np.ones((2, 3), "<u2")),
                      "bool": np.array([True, False])}.items():
        out = io.BytesIO()
        np.save(out, arr)
        put("npy_header_fuzzer", name, out.getvalue())

    with open(os.path.join(HERE, "..", "deploy", "ferryd.conf.example")) as f:
        put("config_fuzzer", "example", f.read())
    put("config_fuzzer", "roots", 'dataset_roots: "/data"\nfollow_symlinks_within_roots: true\n'
        "decode_limits { max_image_pixels: 1000 max_sample_bytes: 5 }\n"
        "max_sessions: 10\nmax_sessions_per_uid: 2\nread_retry_seconds: 1\n")
    put("config_fuzzer", "gather", "gather_streams: 4\ngather_thread_blocks: 16\n"
        "unix_socket_mode: 0600\nhost_memory_budget_bytes: 1048576\n")

    def packets(*requests):
        return b"".join(bytes([len(r)]) + r for r in requests)
    put("session_fuzzer", "fd", packets(b"FD ok", b"FD missing"))
    put("session_fuzzer", "channel", packets(b"CHANNEL a", b"CHANNEL a", b"CHANNEL b"))
    put("session_fuzzer", "unknown", packets(b"HELLO", b"", b"FD "))

    msg = struct.pack("<IIqqqII", 4, 1, 0, 0, 0, 0, 1)  # a Release
    start = struct.pack("<IIqqqII", 3, 0, 0, 2, 5, 0, 0)  # StartEpoch
    ready = struct.pack("<IIqqqII", 1, 2, 9, 0, 1, 16, 0)  # BatchReady
    put("batch_channel_fuzzer", "exchange",
        b"\x00" + start + b"\x01" + b"\x02" + ready + b"\x03" + b"\x00" + msg + b"\x01\x05")
    put("batch_channel_fuzzer", "scribble",
        b"\x04\x00\x00\x08" + b"\xff" * 8 + b"\x00" + msg + b"\x01" +
        b"\x04\x40\x00\x04" + b"\x7f\xff\xff\xff" + b"\x01")

    specs = {
        "tokens": {"dataset": {"tokens": {"path": JOBSPEC_ROOT + "/tokens.bin",
                                          "tokenDtype": "UINT16", "seqLen": 16}},
                   "batchSize": 4, "worldSize": 2, "shuffle": True},
        "records": {"dataset": {"records": {"path": JOBSPEC_ROOT + "/records.bin",
                                            "dtype": "UINT8", "shape": ["64"]}},
                    "batchSize": 8},
        "npy": {"dataset": {"npy": {"path": JOBSPEC_ROOT + "/array.npy"}}, "batchSize": 2,
                "dropLast": True},
        "images": {"dataset": {"imageFolder": {"root": JOBSPEC_ROOT + "/images"}},
                   "transform": {"randomResizedCrop": {"size": 8, "flip": True}},
                   "batchSize": 2},
        "webdataset": {"dataset": {"webdataset": {"shards": [JOBSPEC_ROOT + "/s-{0..1}.tar"]}},
                       "transform": {"centerCrop": {"size": 8}}, "batchSize": 2},
        "huge": {"dataset": {"records": {"path": JOBSPEC_ROOT + "/records.bin",
                                         "dtype": "UINT8", "shape": ["4096"]}},
                 "batchSize": 1048576},
    }
    for name, spec in specs.items():
        put("jobspec_fuzzer", name, json.dumps(spec))


if __name__ == "__main__":
    main()
