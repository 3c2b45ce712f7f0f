"""first call: kernels × cold/warm compilation cache → seconds to the first result in fresh processes.

Each measurement is a fresh Python process. Cold: an empty TENSORLANG_CACHE_DIR; warm: a cache
that one earlier process filled. The child reports the time of its imports (NumPy, tensorlang and
codegen, with sympy, islpy, llvmlite), then of `tl.compile` + the first call; the parent adds the
process's whole wall time. Medians of --repeat runs (default 3).

Usage: python papers/2026-11-cpu-kernels/first_call.py [--repeat 3] [--kernels sgemm-512,...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
import paperbench  # noqa: E402 - unsets the OpenBLAS presets, which the child processes inherit

DEFAULT = "sgemm-512,softmax-4096x1024,conv2d-64x56"

CHILD = """
import json, sys, time
t0 = time.perf_counter()
sys.path[:0] = [{repo!r}, {here!r}]
import numpy as np
import tensorlang as tl
import codegen  # tensorlang imports it lazily, on the first tl.compile: count it as an import
t1 = time.perf_counter()
from kernels import suite
case = next(k for k in suite(quick=False) if k.name == {name!r})
inputs = case.make_inputs(np.random.default_rng(0))
t2 = time.perf_counter()
k = tl.compile(case.tc)
t3 = time.perf_counter()
out = k(*inputs)
t4 = time.perf_counter()
print(json.dumps({{"imports": t1 - t0, "compile": t3 - t2, "first_call": t4 - t3, "first_result": t4 - t2,
                  "disk_hits": k.disk_hits}}))
"""


def run(name: str, cache: Path) -> dict:
    env = dict(os.environ, TENSORLANG_CACHE_DIR=str(cache))
    env.pop("TENSORLANG_CACHE", None)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(repo=str(REPO), here=str(HERE), name=name)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    record["process"] = time.perf_counter() - start
    return record


def median(records: list[dict], field: str) -> float:
    return statistics.median(r[field] for r in records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kernels", default=DEFAULT)
    args = parser.parse_args()
    print(paperbench.env_note(), flush=True)
    fields = ("imports", "compile", "first_call", "first_result", "process")
    print(f"{'kernel':22} {'cache':5} " + " ".join(f"{f:>12}" for f in fields) + "  (medians, s)")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.kernels.split(","):
            cold = [run(name, Path(tmp) / f"{name}-cold-{i}") for i in range(args.repeat)]
            warm_dir = Path(tmp) / f"{name}-warm"
            run(name, warm_dir)  # fills the cache
            warm = [run(name, warm_dir) for _ in range(args.repeat)]
            assert all(r["disk_hits"] == 0 for r in cold) and all(r["disk_hits"] >= 1 for r in warm)
            for label, records in (("cold", cold), ("warm", warm)):
                values = " ".join(f"{median(records, f):12.3f}" for f in fields)
                print(f"{name:22} {label:5} {values}", flush=True)
            ratio = median(warm, "first_result") / median(cold, "first_result")
            print(f"{name:22} warm/cold first result {ratio:.2f}", flush=True)


if __name__ == "__main__":
    main()
