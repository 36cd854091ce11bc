#!/usr/bin/env python3
"""Writes torchvision's outputs for the image ops of server/decode/image_ops.h.

For a few deterministic uint8 RGB images (numpy-generated: smooth gradients, noise, flat and
saturated patches) and fixed parameters, runs torchvision.transforms.v2.functional (or, where
v2 is missing, the v1 torchvision.transforms.functional, for development only) and writes

  <out>/ops.bin       the input images, then every case's output, uint8 HWC, back to back
  <out>/manifest.txt  one line per input, magnitude table and case (format below)

which image_ops_torchvision_test reads. The references that are checked in come from the
torchvision users run (0.26, v2); the manifest's first lines say which produced them.

Manifest lines (space-separated key=value; args is a comma-separated list):
  input name=img0 size=HxW offset=N
  table op=ShearX values=<float.hex>,...      TrivialAugmentWide magnitudes, 31 bins
  case op=<op> in=<input> args=<...> size=HxW offset=N

  python3 testing/make_torchvision_references.py --out testing/data/torchvision_ops
"""
import argparse
import os

import numpy as np
import torch
import torchvision

try:
    import torchvision.transforms.v2 as T2
    import torchvision.transforms.v2.functional as F

    API = "v2"
except ImportError:  # torchvision < 0.15: v1 only
    import torchvision.transforms.functional as F
    from torchvision.transforms import autoaugment as _v1_autoaugment

    API = "v1"

NUM_BINS = 31
# Sizes (height, width) whose pixel count is a multiple of 64, so torch's vectorised CPU
# loops cover every pixel (no scalar tail with possibly different rounding).
SIZES = [(40, 48), (48, 56), (56, 64)]
AUGMENT_OPS = [
    "Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
    "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize",
]
SIGNED = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
          "Contrast", "Sharpness"}


def make_image(seed, height, width):
    """A photo-like uint8 HWC image: smooth colour fields, texture, flat and saturated patches."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    img = np.empty((height, width, 3))
    for c in range(3):
        fx, fy, phase = rng.uniform(0.02, 0.15), rng.uniform(0.02, 0.15), rng.uniform(0, 6.3)
        base = 128 + 90 * np.sin(fx * x + phase) * np.cos(fy * y + 0.5 * phase)
        img[..., c] = base + rng.normal(0, 12, (height, width))
    # A flat gray block (equal channels: hue's max == min case) and saturated corners.
    img[4:12, 4:14, :] = 97
    img[-6:, -6:, :] = [255, 0, 0]
    img[:3, -5:, :] = [0, 255, 255]
    img[-4:, :4, :] = 0
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def chw(img):
    return torch.from_numpy(img).permute(2, 0, 1).contiguous()


def hwc(t):
    return t.permute(1, 2, 0).contiguous().numpy()


def f32(v):
    """The float32 value nearest v, as a Python float (how ColorJitter's draws come out)."""
    return float(np.float32(v))


def magnitude_tables(height, width):
    if API == "v2":
        space = T2.TrivialAugmentWide._AUGMENTATION_SPACE
    else:
        space = torchvision.transforms.TrivialAugmentWide()._augmentation_space(NUM_BINS)
    tables = {}
    for name in AUGMENT_OPS:
        entry = space[name]
        if API == "v2":
            values = entry[0](NUM_BINS, height, width)
        else:
            values = entry[0]
        if values is None or values.ndim == 0:
            continue
        if API == "v1" and name == "Solarize":
            values = values / 255.0  # v1 keeps the threshold in pixels; v2 as a fraction
        tables[name] = [float(v) for v in values]
    return tables


def apply_augment(t, name, magnitude):
    if API == "v2":
        aug = T2.TrivialAugmentWide()
        return aug._apply_image_or_video_transform(
            t, name, magnitude, interpolation=T2.InterpolationMode.NEAREST, fill=aug._fill)
    if name == "Solarize":
        magnitude *= 255.0
    return _v1_autoaugment._apply_op(
        t, name, magnitude, interpolation=torchvision.transforms.InterpolationMode.NEAREST,
        fill=None)


def pad_image(t, padding, fill, mode):
    if API == "v2" or not isinstance(fill, list):
        return F.pad(t, padding, fill=fill, padding_mode=mode)
    # v1 takes no per-channel fill for tensors: pad with 0, then paint the border (as v2 does).
    left, top, right, bottom = padding
    out = F.pad(t, padding, fill=0, padding_mode=mode)
    h, w = out.shape[-2:]
    border = torch.ones((h, w), dtype=torch.bool)
    border[top:h - bottom, left:w - right] = False
    out[:, border] = torch.tensor(fill, dtype=torch.uint8)[:, None]
    return out


def cases(tables):
    """(op, input index, args, function of the CHW tensor) for every reference case."""
    out = []
    for i in range(3):
        out.append(("hflip", i, [], F.hflip))
        out.append(("vflip", i, [], F.vflip))
        out.append(("grayscale", i, [], lambda t: F.rgb_to_grayscale(t, num_output_channels=3)))
    for i, (mode, pad) in enumerate([("constant", (3, 1, 0, 5)), ("edge", (2, 4, 5, 1)),
                                     ("reflect", (5, 3, 2, 6)), ("symmetric", (4, 2, 7, 3))]):
        fill = [12, 200, 77] if mode == "constant" else 0
        fill_args = fill if mode == "constant" else [0, 0, 0]
        out.append(("pad", i % 3, list(pad) + [mode] + fill_args,
                    lambda t, p=list(pad), m=mode, f=fill: pad_image(t, p, f, m)))
    out.append(("crop", 1, [5, 7, 20, 31], lambda t: F.crop(t, 5, 7, 20, 31)))
    for i, size in enumerate([(23, 29), (64, 80), (40, 17)]):
        out.append(("resize", i, list(size),
                    lambda t, s=list(size): F.resize(t, s, antialias=True)))
    for i, f in enumerate([0.0, f32(0.6), f32(1.37), f32(1.9)]):
        out.append(("brightness", i % 3, [f], lambda t, f=f: F.adjust_brightness(t, f)))
        out.append(("contrast", (i + 1) % 3, [f], lambda t, f=f: F.adjust_contrast(t, f)))
        out.append(("saturation", (i + 2) % 3, [f], lambda t, f=f: F.adjust_saturation(t, f)))
    for i, h in enumerate([f32(-0.5), f32(-0.17), f32(0.04), f32(0.31), f32(0.5)]):
        out.append(("hue", i % 3, [h], lambda t, h=h: F.adjust_hue(t, h)))
    out.append(("erase", 2, [9, 13, 17, 21, 5, 250, 128],
                lambda t: F.erase(t, 9, 13, 17, 21,
                                  torch.tensor([5, 250, 128], dtype=torch.uint8)[:, None, None])))
    # Every TrivialAugmentWide op at three bins (both signs for the signed ops), each on
    # every input for the geometric ones (their rounding depends on the size).
    for k, name in enumerate(AUGMENT_OPS):
        if name not in tables:
            for i in range(3):
                out.append(("augment", i, [name, 0.0],
                            lambda t, n=name: apply_augment(t, n, 0.0)))
            continue
        for j, (b, sign) in enumerate([(4, 1.0), (17, -1.0), (30, 1.0 if k % 2 else -1.0)]):
            mag = tables[name][b] * (sign if name in SIGNED else 1.0)
            geometric = name in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
            for i in (range(3) if geometric else [(k + j) % 3]):
                out.append(("augment", i, [name, mag],
                            lambda t, n=name, m=mag: apply_augment(t, n, m)))
    return out


def fmt(v):
    if isinstance(v, float):
        return v.hex()
    return str(v)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)

    images = [make_image(100 + i, h, w) for i, (h, w) in enumerate(SIZES)]
    blob = bytearray()
    cpu = getattr(torch.backends, "cpu", None)
    capability = cpu.get_cpu_capability() if cpu is not None else "unknown"
    lines = [
        f"# torch {torch.__version__} torchvision {torchvision.__version__} api {API} "
        f"cpu_capability {capability}",
        "# written by testing/make_torchvision_references.py; see its docstring for the format",
    ]
    for i, img in enumerate(images):
        lines.append(f"input name=img{i} size={img.shape[0]}x{img.shape[1]} offset={len(blob)}")
        blob += img.tobytes()
    tables = magnitude_tables(*SIZES[0])
    for name, values in tables.items():
        lines.append(f"table op={name} values=" + ",".join(v.hex() for v in values))
    for op, i, case_args, fn in cases(tables):
        result = hwc(fn(chw(images[i])))
        assert result.dtype == np.uint8, (op, result.dtype)
        arg_text = ",".join(fmt(a) for a in case_args) if case_args else "-"
        lines.append(f"case op={op} in=img{i} args={arg_text} "
                     f"size={result.shape[0]}x{result.shape[1]} offset={len(blob)}")
        blob += result.tobytes()
    with open(os.path.join(args.out, "ops.bin"), "wb") as f:
        f.write(blob)
    with open(os.path.join(args.out, "manifest.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} manifest lines, {len(blob)} bytes, api {API}, "
          f"torchvision {torchvision.__version__}")


if __name__ == "__main__":
    main()
