"""TensorBoard's own reader on the trainer's event files.

    tests/test_tensorboard_reader.py WEFT_BINARY

Trains the MLP alone and with 2 workers and 1 server with --tensorboard, reads each directory
with TensorBoard's EventAccumulator, and checks every scalar against the run's metrics.jsonl
(the same values, as float32) and each record's framing with TensorBoard's own masked CRC.
Exits 77 (skipped) when the tensorboard package is missing: ./weft test installs it.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
except ImportError as missing:
    print(f"test_tensorboard_reader: skipped: {missing} (./weft test installs the tensorboard package)")
    sys.exit(77)

weft = sys.argv[1]
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


def train(work, name, *flags):
    out, board = os.path.join(work, name), os.path.join(work, name + "-board")
    subprocess.run([weft, "train", "mlp", "--steps", "20", "--log-every", "5", "--eval-every", "10",
                    "--threads", "1", "--out", out, "--tensorboard", board, *flags],
                   check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return board, records


def check_framing(board):
    for name in os.listdir(board):
        data = open(os.path.join(board, name), "rb").read()
        at = 0
        while at < len(data):
            (length,) = struct.unpack_from("<Q", data, at)
            (header_crc,) = struct.unpack_from("<I", data, at + 8)
            (data_crc,) = struct.unpack_from("<I", data, at + 12 + length)
            check(header_crc == masked_crc32c(data[at:at + 8]), f"{name}: header CRC at {at}")
            check(data_crc == masked_crc32c(data[at + 12:at + 12 + length]), f"{name}: data CRC at {at}")
            at += 16 + length


def scalars(board):
    events = EventAccumulator(board)
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def close(a, b):
    return abs(a - b) <= 1e-6 * (1 + abs(b))


def check_run(board, records, distributed):
    check_framing(board)
    got = scalars(board)
    logs = [r for r in records if "loss" in r]
    evaluations = [r for r in records if "eval" in r and "step" in r]
    final = [r for r in records if "model" in r][-1]
    check([s for s, _ in got.get("train/loss", [])] == [r["step"] for r in logs], f"{board}: train/loss steps")
    for (step, value), r in zip(got.get("train/loss", []), logs):
        check(close(value, r["loss"]), f"{board}: train/loss at {step}: {value} vs {r['loss']}")
    for (step, value), r in zip(got.get("train/examples_per_s", []), logs):
        check(close(value, r["examples_per_s"]), f"{board}: examples_per_s at {step}")
    check(len(got.get("train/learning_rate", [])) == len(logs), f"{board}: train/learning_rate")
    for tag, expected in (("eval/accuracy", [(r["step"], r["eval"]["accuracy"]) for r in evaluations]),
                          ("final/accuracy", [(20, final["eval"]["accuracy"])])):
        found = got.get(tag, [])
        check(len(found) == len(expected) and all(s == t and close(v, w) for (s, v), (t, w) in zip(found, expected)),
              f"{board}: {tag} {found} vs {expected}")
    dist_tags = [t for t in got if t.startswith("dist/")]
    if distributed:
        check("dist/bytes_per_step" in got and all(v > 0 for _, v in got["dist/bytes_per_step"]),
              f"{board}: dist/bytes_per_step {got.get('dist/bytes_per_step')}")
        check(all(v > 0 for _, v in got.get("dist/dense_bytes_per_step", [])), f"{board}: dense bytes")
    else:
        check(dist_tags == [], f"{board}: a lone run wrote {dist_tags}")


with tempfile.TemporaryDirectory() as work:
    check_run(*train(work, "alone"), distributed=False)
    check_run(*train(work, "job", "--workers", "2", "--servers", "1"), distributed=True)

for failure in failures:
    print("test_tensorboard_reader: " + failure)
print("test_tensorboard_reader: " + ("FAILED" if failures else "TensorBoard read every scalar the trainer logged"))
sys.exit(1 if failures else 0)
