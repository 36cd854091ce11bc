"""Writes PNG files of every type for ferry's tests and fuzz seeds, in pure Python (zlib +
struct), because PIL cannot write some of them: 16-bit RGB(A), 16-bit gray+alpha, Adam7
interlaced files, a tRNS chunk of our choosing, an eXIf chunk after the image data. PIL reads
them all, and is the reference the tests compare ferry with.

    data = encode_png(width, height, COLOR_RGB, 16, pixels)   # pixels[y][x] = (r, g, b)
    data = encode_png(w, h, COLOR_PALETTE, 4, pixels, palette=[(r, g, b), ...],
                      trns=bytes([0, 128]), interlace=True, exif=tiff_block)

Also exif_orientation_block(), the TIFF structure of an EXIF block holding one Orientation."""

import struct
import zlib

COLOR_GRAY, COLOR_RGB, COLOR_PALETTE, COLOR_GRAY_ALPHA, COLOR_RGBA = 0, 2, 3, 4, 6
CHANNELS = {COLOR_GRAY: 1, COLOR_RGB: 3, COLOR_PALETTE: 1, COLOR_GRAY_ALPHA: 2, COLOR_RGBA: 4}
# Adam7 passes: (x0, y0, dx, dy).
ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
         (0, 1, 1, 2)]


def chunk(kind, data):
    """One chunk: length, type, data, CRC."""
    return (struct.pack(">I", len(data)) + kind + data +
            struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))


def _pack(samples, depth):
    if depth == 16:
        return struct.pack(">%dH" % len(samples), *samples)
    if depth == 8:
        return bytes(samples)
    out = bytearray()
    per_byte = 8 // depth
    for i in range(0, len(samples), per_byte):
        byte = 0
        for j, v in enumerate(samples[i:i + per_byte]):
            byte |= v << (8 - depth * (j + 1))
        out.append(byte)
    return bytes(out)


def encode_png(width, height, color_type, depth, pixels, interlace=False, palette=None,
               trns=None, exif=None, exif_after_idat=False):
    """pixels[y][x]: a tuple of CHANNELS[color_type] samples, each < 2**depth. Rows are
    written unfiltered (filter type 0)."""
    raw = bytearray()
    passes = ADAM7 if interlace else [(0, 0, 1, 1)]
    for x0, y0, dx, dy in passes:
        xs, ys = range(x0, width, dx), range(y0, height, dy)
        if not xs or not ys:
            continue  # an empty pass has no rows at all
        for y in ys:
            raw += b"\0" + _pack([s for x in xs for s in pixels[y][x]], depth)
    out = b"\x89PNG\r\n\x1a\n" + chunk(
        b"IHDR", struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, int(interlace)))
    if palette is not None:
        out += chunk(b"PLTE", bytes(c for entry in palette for c in entry))
    if trns is not None:
        out += chunk(b"tRNS", trns)
    if exif is not None and not exif_after_idat:
        out += chunk(b"eXIf", exif)
    out += chunk(b"IDAT", zlib.compress(bytes(raw), 9))
    if exif is not None and exif_after_idat:
        out += chunk(b"eXIf", exif)
    return out + chunk(b"IEND", b"")


def exif_orientation_block(orientation, big_endian=False):
    """A TIFF structure whose IFD0 holds one Orientation (0x0112, SHORT) entry: an eXIf
    chunk's data, or an APP1 segment's after b"Exif\\0\\0"."""
    e = ">" if big_endian else "<"
    return ((b"MM" if big_endian else b"II") + struct.pack(e + "HI", 42, 8) +
            struct.pack(e + "HHHIHH", 1, 0x0112, 3, 1, orientation, 0) + struct.pack(e + "I", 0))
