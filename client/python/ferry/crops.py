"""ferry.RandomResizedCrop and ferry.CenterCrop, the single-step image transforms (several
steps: ferry.transforms.Compose)."""

from ferry import transforms
from ferry._checks import _check_bool, _check_int, _check_range


class RandomResizedCrop:
    """torchvision's RandomResizedCrop(size, scale, ratio), then RandomHorizontalFlip(0.5)
    when flip is set. full_decode: decode each JPEG at full resolution as torchvision does;
    by default ferry decodes at half resolution where that still gives the crop `size`
    pixels a side, which is faster and differs by a little (docs/data.md,
    "Reduced-scale decode")."""

    def __init__(self, size, scale=transforms._CROP_SCALE, ratio=transforms._CROP_RATIO,
                 flip=False, full_decode=False):
        self.size = _check_int("RandomResizedCrop size", size, 1, 65535)
        self.scale = _check_range("RandomResizedCrop scale", scale)
        if self.scale[1] > 1.0:
            raise ValueError("RandomResizedCrop scale must be at most 1.0, got %r" % (scale,))
        self.ratio = _check_range("RandomResizedCrop ratio", ratio)
        self.flip = _check_bool("RandomResizedCrop flip", flip)
        self.full_decode = _check_bool("RandomResizedCrop full_decode", full_decode)

    def _spec(self):
        spec = {"size": self.size, "scale_min": self.scale[0], "scale_max": self.scale[1],
                "ratio_min": self.ratio[0], "ratio_max": self.ratio[1], "flip": self.flip}
        if self.full_decode:  # only when set: a ferryd before the option accepts the rest
            spec["full_decode"] = True
        return {"random_resized_crop": spec}


class CenterCrop:
    """torchvision's Resize(resize) (shorter side) then CenterCrop(size). Default resize:
    size * 256 / 224. full_decode: as for RandomResizedCrop."""

    def __init__(self, size, resize=None, full_decode=False):
        self.size = _check_int("CenterCrop size", size, 1, 65535)
        self.resize = 0 if resize is None else _check_int("CenterCrop resize", resize,
                                                          self.size, 65535)
        self.full_decode = _check_bool("CenterCrop full_decode", full_decode)

    def _spec(self):
        spec = {"size": self.size, "resize": self.resize}
        if self.full_decode:
            spec["full_decode"] = True
        return {"center_crop": spec}
