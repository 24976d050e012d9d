#!/usr/bin/env python3
"""Whether two safetensors checkpoints hold the same variables: f64 tensors within 1e-12 of each
tensor's largest value, f32 ones bit for bit, or within F32_TOLERANCE of it where given; any
other dtype bit for bit. Exits 1 naming the first tensor that differs. The engine tests compare a
job an engine started with the same job started by weft's own launcher.

usage: tests/same_variables.py A B [F32_TOLERANCE]
"""
import json
import struct
import sys


def tensors(path, f32_tolerance):
    """name -> (values, tolerance) for the tensors compared within a tolerance, else raw bytes."""
    with open(path, "rb") as f:
        data = f.read()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    body = data[8 + size:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = body[begin:end]
        if entry["dtype"] == "F64":
            out[name] = (struct.unpack("<%dd" % (len(raw) // 8), raw), 1e-12)
        elif entry["dtype"] == "F32" and f32_tolerance:
            out[name] = (struct.unpack("<%df" % (len(raw) // 4), raw), f32_tolerance)
        else:
            out[name] = raw
    return out


def main():
    f32_tolerance = float(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] else None
    a, b = (tensors(path, f32_tolerance) for path in sys.argv[1:3])
    if a.keys() != b.keys():
        sys.exit(f"the checkpoints hold different tensors: {sorted(set(a) ^ set(b))}")
    for name in a:
        if isinstance(a[name], bytes):
            if a[name] != b[name]:
                sys.exit(f"{name} differs")
            continue
        (x, tolerance), (y, _) = a[name], b[name]
        scale = max([abs(v) for v in x] + [1e-300])
        error = max(abs(p - q) for p, q in zip(x, y))
        if error > tolerance * scale:
            sys.exit(f"{name} differs by {error:.3g}, beyond {tolerance:g} of its largest value {scale:.3g}")


if __name__ == "__main__":
    main()
