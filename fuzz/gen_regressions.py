#!/usr/bin/env python3
"""Writes hand-made regression inputs under fuzz/regressions/ (stdlib only).

webp_bitmask_amplification.tif (tiff_decode): a 16383x2048 image whose
internal 1-bit mask is one WebP-compressed strip. The mask strip decodes to
2048 * 2048 = 4 MiB (within tiff_decode's max_tile_bytes), but the WebP
stream (~40 bytes, single-symbol prefix codes: 0 bits per pixel) declares
16383x2048 RGBA, so the reader allocates and decodes 16383 * 2048 * 4 =
128 MiB before noticing that 4 channels do not fit a 1-sample block: a 32x
bypass of max_tile_bytes (with the default limits: 64 MiB tiles, a
16383x16383 mask, 1 GiB).
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


class Bits:
    def __init__(self):
        self.acc, self.n, self.out = 0, 0, bytearray()

    def put(self, value, bits):
        self.acc |= value << self.n
        self.n += bits
        while self.n >= 8:
            self.out.append(self.acc & 0xFF)
            self.acc >>= 8
            self.n -= 8

    def done(self):
        if self.n:
            self.out.append(self.acc & 0xFF)
        return bytes(self.out)


def vp8l(width, height):
    b = Bits()
    b.put(0x2F, 8)
    b.put(width - 1, 14)
    b.put(height - 1, 14)
    b.put(1, 1)  # alpha used
    b.put(0, 3)  # version
    b.put(0, 1)  # no transform
    b.put(0, 1)  # no colour cache
    b.put(0, 1)  # no meta prefix codes
    for _ in range(5):  # green, red, blue, alpha, distance
        b.put(1, 1)  # simple code
        b.put(0, 1)  # one symbol
        b.put(0, 1)  # 1-bit symbol
        b.put(0, 1)  # symbol 0
    data = b.done()
    chunk = b"VP8L" + struct.pack("<I", len(data)) + data + (b"\0" if len(data) % 2 else b"")
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def tiff(ifds):
    """ifds: list of [(tag, type, [values])]; classic little-endian TIFF."""
    sizes = {1: 1, 3: 2, 4: 4}
    fmt = {1: "B", 3: "H", 4: "I"}
    out = bytearray(b"II*\0" + struct.pack("<I", 8))
    # Lay out IFDs first, out-of-line payloads after all of them.
    ifd_pos, pos = [], 8
    for entries in ifds:
        ifd_pos.append(pos)
        pos += 2 + 12 * len(entries) + 4
    payload = bytearray()
    body = bytearray()
    for i, entries in enumerate(ifds):
        body += struct.pack("<H", len(entries))
        for tag, typ, vals in sorted(entries):
            raw = struct.pack("<" + fmt[typ] * len(vals), *vals)
            if len(raw) <= 4:
                field = raw.ljust(4, b"\0")
            else:
                field = struct.pack("<I", pos + len(payload))
                payload += raw + (b"\0" if len(raw) % 2 else b"")
            body += struct.pack("<HHI", tag, typ, len(vals)) + field
        nxt = ifd_pos[i + 1] if i + 1 < len(ifds) else 0
        body += struct.pack("<I", nxt)
    return bytes(out + body + payload), pos + len(payload)


def webp_bitmask():
    w, h = 16383, 2048
    webp = vp8l(w, h)
    main = [
        (256, 4, [w]), (257, 4, [h]), (258, 3, [8]), (259, 3, [1]), (262, 3, [1]),
        (273, 4, [0] * 8), (277, 3, [1]), (278, 4, [256]), (279, 4, [0] * 8),
    ]
    # The mask strip's offset is only known once the TIFF is laid out; its
    # length is fixed, so lay out twice.
    def mask(off):
        return [
            (254, 4, [4]), (256, 4, [w]), (257, 4, [h]), (258, 3, [1]), (259, 3, [50001]),
            (262, 3, [4]), (273, 4, [off]), (277, 3, [1]), (278, 4, [h]), (279, 4, [len(webp)]),
        ]
    _, end = tiff([main, mask(0)])
    t, end2 = tiff([main, mask(end)])
    assert end == end2
    return t + webp


def main():
    path = os.path.join(HERE, "regressions", "tiff_decode", "webp_bitmask_amplification.tif")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(webp_bitmask())
    print(path, os.path.getsize(path))


if __name__ == "__main__":
    main()
