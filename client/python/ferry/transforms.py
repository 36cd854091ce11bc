"""Composable image transforms, named and defaulted as torchvision.transforms.v2's.

    from ferry import transforms as T
    transform = T.Compose([
        T.RandomResizedCrop(224),
        T.RandomHorizontalFlip(),
        T.TrivialAugmentWide(),
        T.ColorJitter(0.4, 0.4, 0.4),
        T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
        T.RandomErasing(0.25),
    ])
    loader = ferry.Loader(ferry.ImageFolder("/data/train"), batch_size=256,
                          transform=transform, device="cuda:0", shuffle=True)

ferryd runs them: geometric ops on its CPU workers (a leading RandomResizedCrop decodes only
the region it keeps), and for a GPU job the trailing ColorJitter / RandomGrayscale /
Normalize / RandomErasing fused on the GPU. Every random draw comes from (seed, epoch,
sample index, op position), so batches are identical after a resume. Sizes are square (an
int). A Normalize makes the "image" field CHW float32 (on a GPU, image_dtype may pick
float16 or bfloat16). docs/data.md has the table of ops and what differs from torchvision.

A single op may be passed as a transform too: it is a Compose of one.
"""

import math
import numbers

__all__ = ["CenterCrop", "ColorJitter", "Compose", "Normalize", "RandomCrop", "RandomErasing",
           "RandomGrayscale", "RandomHorizontalFlip", "RandomResizedCrop",
           "RandomVerticalFlip", "Resize", "TrivialAugmentWide"]


def _number(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError("%s must be a number, got %r" % (name, value))
    value = float(value)
    if not math.isfinite(value):
        raise ValueError("%s must be finite, got %r" % (name, value))
    return value


def _size(name, value):
    if isinstance(value, (tuple, list)):
        if len(value) == 2 and value[0] == value[1]:
            value = value[0]
        elif len(value) == 1:
            value = value[0]
        else:
            raise ValueError("%s must be square: an int, got %r" % (name, value))
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError("%s must be an int, got %r" % (name, value))
    if not 1 <= value <= 16384:
        raise ValueError("%s must be in [1, 16384], got %r" % (name, value))
    return int(value)


def _probability(name, p):
    p = _number(name, p)
    if not 0.0 <= p <= 1.0:
        raise ValueError("%s must be in [0, 1], got %r" % (name, p))
    return p


def _pair(name, value):
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError("%s must be a pair (min, max), got %r" % (name, value))
    lo, hi = _number(name, value[0]), _number(name, value[1])
    if lo > hi:
        raise ValueError("%s must satisfy min <= max, got %r" % (name, value))
    return [lo, hi]


def _channels(name, value, allow_none=False, integral=False):
    """A number or 1 or 3 numbers as a list (ints in [0, 255] when integral)."""
    if value is None and allow_none:
        return []
    values = list(value) if isinstance(value, (tuple, list)) else [value]
    if len(values) not in (1, 3):
        raise ValueError("%s takes a number or 3 (R, G, B), got %r" % (name, value))
    if integral:
        for v in values:
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= v <= 255:
                raise ValueError("%s must be ints in [0, 255], got %r" % (name, value))
        return [int(v) for v in values]
    return [_number(name, v) for v in values]


# torchvision's RandomResizedCrop defaults (ferry.RandomResizedCrop has the same).
_CROP_SCALE = (0.08, 1.0)
_CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)


class _Op:
    """One op of a Compose; also usable alone as a transform."""

    def _spec(self):
        return {"compose": {"ops": [self._op()]}}

    def __repr__(self):
        args = ", ".join("%s=%r" % (k, v) for k, v in sorted(vars(self).items()))
        return "%s(%s)" % (type(self).__name__, args)


class RandomResizedCrop(_Op):
    """v2.RandomResizedCrop(size, scale, ratio), antialiased bilinear. full_decode: decode
    JPEGs at full resolution as torchvision does (by default a leading RandomResizedCrop
    decodes at half resolution where that keeps the crop `size` pixels a side)."""

    def __init__(self, size, scale=_CROP_SCALE, ratio=_CROP_RATIO, full_decode=False):
        self.size = _size("RandomResizedCrop size", size)
        self.scale = _pair("RandomResizedCrop scale", scale)
        self.ratio = _pair("RandomResizedCrop ratio", ratio)
        if not 0 < self.scale[0] or not 0 < self.ratio[0]:
            raise ValueError("RandomResizedCrop scale and ratio must be positive")
        if not isinstance(full_decode, bool):
            raise TypeError("RandomResizedCrop full_decode must be a bool")
        self.full_decode = full_decode

    def _op(self):
        return {"random_resized_crop": {"size": self.size, "scale": self.scale,
                                        "ratio": self.ratio, "full_decode": self.full_decode}}


class Resize(_Op):
    """v2.Resize(size): the shorter side to `size` (an int), antialiased bilinear."""

    def __init__(self, size, full_decode=False):
        if isinstance(size, (tuple, list)):
            raise ValueError("Resize size must be an int (the shorter side), got %r; follow it "
                             "with CenterCrop for a fixed shape" % (size,))
        self.size = _size("Resize size", size)
        if not isinstance(full_decode, bool):
            raise TypeError("Resize full_decode must be a bool")
        self.full_decode = full_decode

    def _op(self):
        return {"resize": {"size": self.size, "full_decode": self.full_decode}}


class CenterCrop(_Op):
    """v2.CenterCrop(size); a smaller image is padded with zeros."""

    def __init__(self, size):
        self.size = _size("CenterCrop size", size)

    def _op(self):
        return {"center_crop": {"size": self.size}}


_PADDING_MODES = ("constant", "edge", "reflect", "symmetric")


class RandomCrop(_Op):
    """v2.RandomCrop(size, padding=None, pad_if_needed=False, fill=0, padding_mode="constant").
    padding: an int, (left/right, top/bottom) or (left, top, right, bottom)."""

    def __init__(self, size, padding=None, pad_if_needed=False, fill=0, padding_mode="constant"):
        self.size = _size("RandomCrop size", size)
        if padding is None:
            self.padding = []
        else:
            values = list(padding) if isinstance(padding, (tuple, list)) else [padding]
            if len(values) not in (1, 2, 4) or not all(
                    isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 0
                    for v in values):
                raise ValueError("RandomCrop padding must be an int >= 0 or 2 or 4 of them, "
                                 "got %r" % (padding,))
            self.padding = [int(v) for v in values]
        if not isinstance(pad_if_needed, bool):
            raise TypeError("RandomCrop pad_if_needed must be a bool")
        self.pad_if_needed = pad_if_needed
        self.fill = _channels("RandomCrop fill", fill, integral=True)
        if padding_mode not in _PADDING_MODES:
            raise ValueError("RandomCrop padding_mode must be one of %s, got %r"
                             % (_PADDING_MODES, padding_mode))
        self.padding_mode = padding_mode

    def _op(self):
        return {"random_crop": {"size": self.size, "padding": self.padding,
                                "pad_if_needed": self.pad_if_needed, "fill": self.fill,
                                "padding_mode": self.padding_mode}}


class RandomHorizontalFlip(_Op):
    """v2.RandomHorizontalFlip(p=0.5)."""

    def __init__(self, p=0.5):
        self.p = _probability("RandomHorizontalFlip p", p)

    def _op(self):
        return {"random_horizontal_flip": {"p": self.p}}


class RandomVerticalFlip(_Op):
    """v2.RandomVerticalFlip(p=0.5)."""

    def __init__(self, p=0.5):
        self.p = _probability("RandomVerticalFlip p", p)

    def _op(self):
        return {"random_vertical_flip": {"p": self.p}}


def _jitter(name, value, center, bound, clip_first_on_zero=True):
    """ColorJitter's _check_input: None/0 -> unset; v -> [center - v, center + v]."""
    if value is None:
        return []
    if isinstance(value, (tuple, list)):
        lo, hi = _pair("ColorJitter " + name, value)
    else:
        v = _number("ColorJitter " + name, value)
        if v < 0:
            raise ValueError("ColorJitter %s must be non-negative, got %r" % (name, value))
        lo, hi = center - v, center + v
        if clip_first_on_zero:
            lo = max(lo, 0.0)
    if not bound[0] <= lo <= hi <= bound[1]:
        raise ValueError("ColorJitter %s values must lie in [%s, %s], got %r"
                         % (name, bound[0], bound[1], value))
    return [] if lo == hi == center else [lo, hi]


class ColorJitter(_Op):
    """v2.ColorJitter(brightness=None, contrast=None, saturation=None, hue=None): the set ops
    in a random order, each factor uniform in its range."""

    def __init__(self, brightness=None, contrast=None, saturation=None, hue=None):
        inf = float("inf")
        self.brightness = _jitter("brightness", brightness, 1.0, (0.0, inf))
        self.contrast = _jitter("contrast", contrast, 1.0, (0.0, inf))
        self.saturation = _jitter("saturation", saturation, 1.0, (0.0, inf))
        self.hue = _jitter("hue", hue, 0.0, (-0.5, 0.5), clip_first_on_zero=False)

    def _op(self):
        return {"color_jitter": {"brightness": self.brightness, "contrast": self.contrast,
                                 "saturation": self.saturation, "hue": self.hue}}


class RandomGrayscale(_Op):
    """v2.RandomGrayscale(p=0.1), three output channels."""

    def __init__(self, p=0.1):
        self.p = _probability("RandomGrayscale p", p)

    def _op(self):
        return {"random_grayscale": {"p": self.p}}


class TrivialAugmentWide(_Op):
    """v2.TrivialAugmentWide(num_magnitude_bins=31, interpolation=NEAREST, fill=None)."""

    def __init__(self, num_magnitude_bins=31, fill=None):
        if (isinstance(num_magnitude_bins, bool) or
                not isinstance(num_magnitude_bins, numbers.Integral) or
                not 2 <= num_magnitude_bins <= 1000):
            raise ValueError("TrivialAugmentWide num_magnitude_bins must be an int in [2, 1000], "
                             "got %r" % (num_magnitude_bins,))
        self.num_magnitude_bins = int(num_magnitude_bins)
        self.fill = _channels("TrivialAugmentWide fill", fill, allow_none=True, integral=True)

    def _op(self):
        return {"trivial_augment_wide": {"num_magnitude_bins": self.num_magnitude_bins,
                                         "fill": self.fill}}


class Normalize(_Op):
    """v2.Normalize(mean, std) of the image scaled to [0, 1] (ToDtype(float32, scale=True)):
    the image field becomes CHW float."""

    def __init__(self, mean, std):
        self.mean = _channels("Normalize mean", mean)
        self.std = _channels("Normalize std", std)
        if not all(s > 0 for s in self.std):
            raise ValueError("Normalize std must be > 0, got %r" % (std,))

    def _op(self):
        return {"normalize": {"mean": self.mean, "std": self.std}}


class RandomErasing(_Op):
    """v2.RandomErasing(p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0). value: a
    number or one per channel, on the image's scale where it runs (0..255 before Normalize,
    normalized units after); value="random" is not offered."""

    def __init__(self, p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0):
        self.p = _probability("RandomErasing p", p)
        self.scale = _pair("RandomErasing scale", scale)
        if not (0 <= self.scale[0] and self.scale[1] <= 1):
            raise ValueError("RandomErasing scale must lie in [0, 1], got %r" % (scale,))
        self.ratio = _pair("RandomErasing ratio", ratio)
        if not 0 < self.ratio[0]:
            raise ValueError("RandomErasing ratio must be positive, got %r" % (ratio,))
        if isinstance(value, str):
            raise ValueError("RandomErasing value=%r is not offered: give a number or 3" % value)
        self.value = _channels("RandomErasing value", value)

    def _op(self):
        return {"random_erasing": {"p": self.p, "scale": self.scale, "ratio": self.ratio,
                                   "value": self.value}}


class Compose:
    """v2.Compose(transforms): ferry's ops in order."""

    def __init__(self, transforms):
        transforms = list(transforms)
        if not transforms:
            raise ValueError("Compose needs at least one op (a crop to a fixed size)")
        for t in transforms:
            if not isinstance(t, _Op):
                raise TypeError("Compose takes ferry.transforms ops (a C++ daemon runs them; a "
                                "Python function cannot be passed), got %r" % (t,))
        self.transforms = transforms

    def _spec(self):
        return {"compose": {"ops": [t._op() for t in self.transforms]}}

    def __repr__(self):
        return "Compose([%s])" % ", ".join(repr(t) for t in self.transforms)
