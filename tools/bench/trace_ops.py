#!/usr/bin/env python3
"""Where a step's time goes, by op: reads a Chrome trace written by `weft train ... --trace F`
and prints, for each op type, its time per step, its count per step, its share and the bytes it
moved per second (the op's inputs and outputs, as the trace records them).

A traced GPU op appears twice: on the track "ops" (its launch, on the host) and on the track
"gpu" (its kernels' time on the GPU); the GPU's is summarised where there is one (--track ops
gives the host's). Steps are counted as the times the most frequent node ran; the first `--skip`
of them (the warm-up, where plans are compiled and cuDNN chooses algorithms) are left out.

usage: tools/bench/trace_ops.py TRACE [--skip N] [--top K] [--track gpu|ops]
"""
import argparse
import collections
import json


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--skip", type=int, default=1, help="leading steps left out (default 1)")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--track", choices=["gpu", "ops"], help="default: gpu where the trace has it, else ops")
    a = p.parse_args()
    with open(a.trace) as f:
        everything = json.load(f)["traceEvents"]
    tracks = {e["args"]["name"]: (e["pid"], e["tid"]) for e in everything
              if e.get("ph") == "M" and e.get("name") == "thread_name"}
    track = a.track or ("gpu" if "gpu" in tracks else "ops")
    if track not in tracks:
        raise SystemExit(f"{a.trace}: no track '{track}' (tracks: {', '.join(sorted(tracks)) or 'none'})")
    ops = [e for e in everything if e.get("ph") == "X" and (e["pid"], e["tid"]) == tracks[track]
           and "bytes" in e.get("args", {})]
    if not ops:
        raise SystemExit(f"{a.trace}: no op events (was it written by --trace?)")
    runs = collections.defaultdict(list)  # node name -> its events in time order
    for e in sorted(ops, key=lambda e: e["ts"]):
        runs[e["name"]].append(e)
    steps = max(len(v) for v in runs.values())
    if steps <= a.skip:
        raise SystemExit(f"{a.trace}: {steps} steps recorded, none left after skipping {a.skip}")
    kept = steps - a.skip
    time_us = collections.Counter()
    count = collections.Counter()
    moved = collections.Counter()
    for name, evs in runs.items():
        # A node that ran every step: drop its first `skip` runs; one that ran less often (an
        # evaluation) is kept whole.
        for e in evs[a.skip:] if len(evs) == steps else evs:
            time_us[e["cat"]] += e["dur"]
            count[e["cat"]] += 1
            moved[e["cat"]] += e["args"]["bytes"]
    total = sum(time_us.values())
    print(f"{kept} steps after {a.skip} skipped, track {track}: {total / kept / 1e3:.2f} ms of ops a step, "
          f"{sum(count.values()) / kept:.0f} ops")
    print(f"{'op':28} {'ms/step':>9} {'ops/step':>9} {'share':>7} {'GB/s':>8}")
    for op, us in time_us.most_common(a.top):
        rate = moved[op] / (us * 1e-6) / 1e9 if us else 0
        print(f"{op:28} {us / kept / 1e3:9.3f} {count[op] / kept:9.1f} {100 * us / total:6.1f}% {rate:8.1f}")


if __name__ == "__main__":
    main()
