"""tune: source text and example inputs → TuneResult (`tl.tune`): measured search, every trial recorded in the database.

One run: the default options are measured first (their outputs become the reference every other
candidate must match), then candidates from search.py until the budget is spent; a candidate
whose plan is the same as one measured already is skipped without measuring (the cheap filter:
planning takes milliseconds, a measurement a second). Last, the default and the three fastest
are timed again, interleaved, in one process; the fastest becomes the key's best record only if
its median beats the default's there by more than MARGIN and it is faster in every round (a
paired test: a noise "win" keeps the default).
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import sys
import time
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass

from tensorlang.errors import TensorLangError

from ..options import Options
from . import database, measure
from . import key as key_
from . import space as space_
from .search import Search, canonical

MARGIN = 0.03  # the fastest must beat the default by this much in the final interleaved timing
CONFIRM_TOP = 3


@dataclass(frozen=True)
class TuneResult:
    """What `tl.tune` found: the best Options (the default when nothing beat it), its time and
    the default's (seconds per call, timed interleaved at the end), the trials measured in this
    run (failed ones included), and the database key the record is stored under."""

    options: Options
    best_s: float
    default_s: float
    trials: int
    key: str


def _faults() -> dict[int, str]:
    """TENSORLANG_TUNE_FAULTS="2:crash,3:hang,4:wrong": fault injection by trial number (the
    default is trial 0) for the tests."""
    faults = {}
    for item in os.environ.get("TENSORLANG_TUNE_FAULTS", "").split(","):
        n, _, what = item.partition(":")
        if n.strip().isdigit() and what:
            faults[int(n)] = what.strip()
    return faults


class _Progress:
    def __init__(self, enabled: bool, name: str):
        self.bar = None
        if enabled and sys.stderr.isatty():
            try:
                from tqdm.auto import tqdm
            except ImportError:
                return
            self.bar = tqdm(desc=f"tune {name}", unit="trial", leave=True)

    def update(self, trials: int, failed: int, best: float | None) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(failed=failed, best=f"{best * 1e3:.3f} ms" if best else "-")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _plan_signature(source: str, name: str, knobs: Mapping, sizes: Mapping[str, int]) -> str:
    """A hash of the plan the knobs give (with the flags the plan text does not show)."""
    import tensorlang as tl

    options = key_.from_knobs(dict(knobs), Options(tuned=False))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = tl.compile(source, name, options=options).inspect("plan", sizes=sizes)
    text = f"{plan}\nvectorize={options.vectorize}\nprefetch={options.prefetch}\npipeline={options.pipeline}"
    return hashlib.sha256(text.encode()).hexdigest()


def _direct_conv(kernel, sizes: Mapping[str, int]) -> bool:
    """Whether the default plan runs a direct convolution (the direct_conv knob is a choice)."""
    return "direct convolution" in kernel.inspect("plan", sizes=sizes)


def _wins_every_round(result: Mapping, j: int) -> bool:
    """Whether candidate `j` of a confirm task beat the default (candidate 0) in every round of
    the interleaved timing, not only in the median: a paired test that a burst of load on a
    shared machine (which slows whatever runs during it) cannot pass by chance as easily."""
    rounds = result.get("rounds")
    if not rounds:
        return True
    return all(t < d for t, d in zip(rounds[j], rounds[0]))


def _gemm_blocks(kernel, sizes: Mapping[str, int], dtypes: list[str]) -> tuple[int, int, int] | None:
    """The host's (MC, NC, KC) when the default plan calls the packed GEMM, or runs a direct
    convolution that could (the gemm_blocking knob's centre), else None (the knob would change
    nothing)."""
    from ..host import gemm_blocking

    plan = kernel.inspect("plan", sizes=sizes)
    if "GEMM m=" not in plan and "direct convolution" not in plan:
        return None
    dtype = next((d for d in dtypes if d in ("float32", "float64")), "float32")
    cfg = gemm_blocking(dtype)
    return cfg.mc, cfg.nc, cfg.kc


def tune(
    source: str,
    *example_args: object,
    name: str | None = None,
    budget_s: float = 60,
    executor: Executor | None = None,
    progress: bool = True,
    **keyword_sizes: int,
) -> TuneResult:
    """Search the schedule space of the def `name` of `source` for the sizes and dtypes of
    `example_args` (the inputs, in def order) for about `budget_s` seconds; record every trial
    in the tuning database and the best as the key's record, which `tl.compile` then uses for
    calls of these sizes and dtypes (unless `Options(tuned=False)`). `executor`, any
    concurrent.futures.Executor, compiles and measures candidates on its workers (one
    measurement at a time per machine). Sizes no input's shape gives (a time-step count) are
    given by keyword, as to the kernel: `tl.tune(src, A, T=100)`; they are part of the key, and a
    kernel called as `k(A, T=100)` finds the record."""
    import warnings

    import numpy as np

    import tensorlang as tl

    from ..runtime import arguments as args_

    if not isinstance(budget_s, int | float) or budget_s < 0:
        raise TensorLangError(f"tune: budget_s must be a non-negative number, got {budget_s!r}")
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        default_kernel = tl.compile(source, name, options=Options(tuned=False))
    program = default_kernel.interface
    if len(example_args) != len(program.inputs):
        raise TensorLangError(
            f"tune: {program.name} takes {len(program.inputs)} inputs, {len(example_args)} given"
        )
    arrays = [
        np.ascontiguousarray(args_.as_input_array(v, t, program))
        for v, t in zip(example_args, program.inputs)
    ]
    sizes = args_.bind_keyword_sizes(
        program, args_.bind_sizes(program, arrays, default_kernel._input_dims), keyword_sizes
    )
    given = {k: sizes[k] for k in keyword_sizes}  # passed to every candidate's calls
    base = Options()
    dtypes = [str(d) for d in default_kernel._input_dtypes]
    description = key_.describe(source, program.name, sizes, dtypes, base)
    key = key_.key_of(description)
    threads = base.thread_count()
    faults = _faults()

    db = database.Database()
    try:
        db.add_program(key, program.name, description)
        previous = db.trials(key)
        schedule_text = default_kernel.inspect("schedule")
        gemm = _gemm_blocks(default_kernel, sizes, dtypes)
        conv = _direct_conv(default_kernel, sizes)
        space = space_.space_for(schedule_text, sizes, gemm, base.thread_count(), conv)
        rng = random.Random(int(key[:8], 16) ^ len(previous))
        earlier_ok = sorted((t.seconds, t.id, t.knobs) for t in previous if t.status == "ok" and t.seconds)
        seeds = [k for _, _, k in earlier_ok[:4]]
        search = Search(space, rng, seeds)
        ids: dict[str, int] = {}
        for t in previous:  # resume: what was measured before is not measured again
            if canonical(t.knobs) != canonical(space.default()):
                search.record(t.knobs, t.seconds if t.status == "ok" else None)
                if t.status == "ok":
                    ids.setdefault(canonical(t.knobs), t.id)
        bar = _Progress(progress, program.name)
        counts = {"trials": 0, "failed": 0}

        def task(knobs: Mapping, **extra) -> dict:
            n = counts["trials"] + extra.pop("offset", 0)
            return {
                "kind": "one",
                "source": source,
                "name": program.name,
                "threads": threads,
                "candidates": [dict(knobs)],
                "inputs": arrays,
                "sizes": given,
                "fault": faults.get(n),
                **extra,
            }

        def note(knobs: Mapping, result: dict) -> None:
            status = result.get("status", "error")
            seconds = result.get("seconds") if status == "ok" else None
            trial = db.add_trial(key, dict(knobs), seconds, status, str(result.get("detail", "")))
            if status == "ok":
                ids[canonical(knobs)] = trial
            else:
                counts["failed"] += 1
            counts["trials"] += 1
            ranked = search.ranked()
            bar.update(counts["trials"], counts["failed"], ranked[0][0] if ranked else None)

        # 1. the default: the reference outputs and the first time
        default_knobs = space.default()
        first = measure.evaluate(task(default_knobs, keep_outputs=True, timeout_s=600.0))
        if first.get("status") != "ok":
            note(default_knobs, first)
            raise TensorLangError(
                f"tune: the default options failed: {first.get('status')}: {first.get('detail')}"
            )
        reference = first.pop("outputs")
        search.record(default_knobs, first["seconds"])
        note(default_knobs, first)
        default_id = ids[canonical(default_knobs)]
        timeout_s = max(4.0, 4.0 * first["wall_s"])
        signatures = {_plan_signature(source, program.name, default_knobs, sizes)}

        def run(batch: list[dict]) -> list[dict]:
            best = search.ranked()[0][0]
            tasks = [
                task(k, reference=reference, timeout_s=timeout_s + 20 * best, best_s=best, offset=i)
                for i, k in enumerate(batch)
            ]
            if executor is None:
                return [measure.evaluate(t) for t in tasks]
            futures = [executor.submit(measure.evaluate, t) for t in tasks]
            results = []
            for f in futures:
                try:
                    results.append(f.result())
                except Exception as exc:  # a worker lost (BrokenProcessPool, a dead Dask worker)
                    results.append({"status": "crash", "detail": f"executor: {type(exc).__name__}: {exc}"})
            return results

        width = max(1, int(getattr(executor, "_max_workers", 2) or 2)) if executor is not None else 1
        # 2. search until the budget is spent
        while time.perf_counter() - start < budget_s:
            batch: list[dict] = []
            while len(batch) < width and time.perf_counter() - start < budget_s:
                knobs = search.propose()
                if knobs is None:
                    break
                try:
                    signature = _plan_signature(source, program.name, knobs, sizes)
                except Exception as exc:  # noqa: BLE001  the candidate cannot be planned
                    search.record(knobs, None)
                    note(knobs, {"status": "error", "detail": f"{type(exc).__name__}: {exc}"})
                    continue
                if signature in signatures:  # the same code as a candidate measured already
                    search.record(knobs, math.inf)
                    continue
                signatures.add(signature)
                batch.append(knobs)
            if not batch:
                break
            for knobs, result in zip(batch, run(batch)):
                search.record(knobs, result.get("seconds") if result.get("status") == "ok" else None)
                note(knobs, result)

        # 3. the default and the fastest few, timed again interleaved
        finalists = [k for _, k in search.ranked() if canonical(k) != canonical(default_knobs)][:CONFIRM_TOP]
        best_knobs, best_s, default_s, best_id = default_knobs, first["seconds"], first["seconds"], default_id
        if finalists:
            confirm = task(
                default_knobs, reference=reference, timeout_s=timeout_s * (1 + len(finalists)) + 30
            )
            confirm.update(kind="confirm", candidates=[default_knobs, *finalists], rounds=5, fault=None)
            result = measure.evaluate(confirm)
            if result.get("status") == "ok":
                times = result["times"]
                default_s = best_s = times[0]
                j = min(range(len(times)), key=times.__getitem__)
                if j and times[j] < times[0] * (1 - MARGIN) and _wins_every_round(result, j):
                    best_knobs, best_s = finalists[j - 1], times[j]
                    best_id = ids.get(canonical(best_knobs), default_id)
        db.set_best(key, best_id, best_knobs, best_s, default_s)
        bar.close()
    finally:
        db.close()
    return TuneResult(key_.from_knobs(best_knobs, Options()), best_s, default_s, counts["trials"], key)
