"""Runs tensorlang's cuda kernels of run.py (full sizes) three times each, for a profiler to read:

    ncu --clock-control none -k regex:tl_ --launch-skip-before-match 0 --section SpeedOfLight \
        --section Occupancy --section LaunchStats python papers/2026-11-gpu/profile_tl.py [--only NAME,...]

The first call of each kernel compiles and loads it; the profiler sees all three calls' launches
(the `tl_<def>_phase<n>` entries). Nothing is timed here: run.py does the timing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import run  # noqa: E402  (the benchmark's sources and sizes)


def main() -> int:
    import torch

    import tensorlang as tl

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated name prefixes (softmax,sgemm,...)")
    parser.add_argument("--calls", type=int, default=3)
    opts = parser.parse_args()
    wanted = [w for w in opts.only.split(",") if w]
    for name, (src, shapes, _, _) in run.FULL.items():
        if wanted and not any(name.startswith(w) for w in wanted):
            continue
        gen = torch.Generator(device="cuda").manual_seed(0)
        args = [torch.randn(s, device="cuda", generator=gen) for s in shapes]
        kernel = tl.compile(src, target="cuda")
        for _ in range(opts.calls):
            kernel(*args)
        torch.cuda.synchronize()
        print(f"{name}: {opts.calls} calls", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
