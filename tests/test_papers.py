"""The experiments in papers/ run in --quick mode and follow the convention of papers/paperbench.py:
results.json (metadata + rows with medians and ratios to NumPy), results.md (a table with every
kernel), plot.png when matplotlib is importable, and every tensorlang result matches NumPy.
No timing is asserted: these are correctness and format checks only."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAPERS = ROOT / "papers"
CPU_KERNELS = PAPERS / "2026-11-cpu-kernels" / "run.py"
FUSION = PAPERS / "2026-11-fusion" / "run.py"
GEMM = PAPERS / "gemm-microkernel" / "bench.py"
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
FUSION_KERNELS = {"softmax", "layernorm", "mlp3", "conv_bias_relu", "chain", "groupnorm"}
GEMM_QUICK = {f"{p}-{lay}-{n}" for p in ("sgemm", "dgemm") for lay in ("NN", "TT") for n in (96, 160)}


def _run_quick(script: Path, out: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run an experiment in quick mode with the machine's OpenBLAS presets set, as on these machines;
    it exits non-zero when a result is wrong."""
    run_env = dict(os.environ, OPENBLAS_CORETYPE="Haswell", OPENBLAS_L2_SIZE="512", **(env or {}))
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=run_env,
    )
    assert proc.returncode == 0, f"{script.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _check_convention(
    out: Path, proc: subprocess.CompletedProcess, experiment: str, kernels: set[str]
) -> dict:
    """The parts every experiment shares; returns results.json."""
    results = json.loads((out / "results.json").read_text())
    assert results["experiment"] == experiment
    assert results["schema"] == "tensorlang-papers/1"
    assert results["mode"] == "quick"
    assert results["question"]
    meta = results["metadata"]
    assert meta["date"] and meta["command"]
    assert meta["machine"]["cpu_model"] is not None and meta["machine"]["usable_cpus"] >= 1
    for package in ("python", "numpy", "llvmlite", "tensorlang"):
        assert meta["versions"][package], package
    # the presets were removed before NumPy was imported, and the output says so
    assert meta["env_unset"]["removed"] == {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"}
    assert "Unset OPENBLAS_CORETYPE=Haswell" in proc.stdout
    assert {row["kernel"] for row in results["rows"]} == kernels
    for row in results["rows"]:
        assert row["threads"] in results["settings"]["threads"]
        assert row["unit"]
        assert row["median_s"]["numpy"] > 0, row["kernel"]
        assert row["ratio_to_numpy"]["numpy"] == pytest.approx(1.0)
        for impl, median in row["median_s"].items():
            assert median > 0
            assert row["ratio_to_numpy"][impl] == pytest.approx(row["median_s"]["numpy"] / median)
            assert row["status"][impl] == "ok", (row["kernel"], impl, row["status"][impl])
    md = (out / "results.md").read_text()
    assert md.startswith("# ") and "Unset OPENBLAS_CORETYPE" in md
    table_rows = [line for line in md.splitlines() if line.startswith("| ")]
    for name in kernels:
        assert any(name in line for line in table_rows), f"{name} not in results.md"
    assert all(line.endswith("|") for line in table_rows)
    if HAVE_MATPLOTLIB:
        assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "matplotlib is not importable" in proc.stdout
    return results


def test_cpu_kernels_quick(tmp_path):
    """1 thread and 2 threads (worker processes), every tensorlang kernel verified against NumPy."""
    spec = importlib.util.spec_from_file_location("_cpu_kernels", CPU_KERNELS.parent / "kernels.py")
    kernels_mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = kernels_mod  # dataclasses look their module up there
    try:
        spec.loader.exec_module(kernels_mod)
    finally:
        del sys.modules[spec.name]
    names = {k.name for k in kernels_mod.suite(quick=True)}
    proc = _run_quick(CPU_KERNELS, tmp_path, "--threads", "1,2")
    results = _check_convention(tmp_path, proc, "2026-11-cpu-kernels", names)
    assert results["settings"]["threads"] == [1, 2]
    assert {(row["kernel"], row["threads"]) for row in results["rows"]} == {
        (n, t) for n in names for t in (1, 2)
    }
    for row in results["rows"]:
        assert set(row["median_s"]) >= {"numpy", "tensorlang"}, row["kernel"]
        tl = row["details"]["tensorlang"]
        assert tl["correct"] and tl["compile_count"] == 1
        assert f"threads={row['threads']}" in tl["options"]
        if row["threads"] == 1:  # NumPy's own result is checked against a float64 formulation
            assert row["details"]["numpy"]["checked_against"] == "float64 oracle"
    assert results["summary"]["tensorlang_all_correct"]
    assert results["call_overhead"]["correct"]
    # absent peers are named, not silently dropped
    for peer in ("torch", "numba", "tvm", "halide"):
        assert peer in results["peers"]
        if not results["peers"][peer]["available"]:
            assert peer in proc.stdout.split("not installed (skipped):")[1].splitlines()[0]
    md = (tmp_path / "results.md").read_text()
    assert "**1 thread**" in md and "**2 threads**" in md


@pytest.mark.slow  # ~4-7 s: the default run stays under 10 minutes on 2 cores
def test_fusion_quick(tmp_path):
    """Every fusion strategy of every kernel matches NumPy (the script exits 1 otherwise)."""
    proc = _run_quick(FUSION, tmp_path)
    results = _check_convention(tmp_path, proc, "2026-11-fusion", FUSION_KERNELS)
    for row in results["rows"]:
        assert set(row["median_s"]) >= {"numpy", "tl-auto", "tl-max", "tl-none"}
        assert all(row["correct"].values()), row["kernel"]


def test_gemm_microkernel_quick(tmp_path):
    proc = _run_quick(GEMM, tmp_path)
    results = _check_convention(tmp_path, proc, "gemm-microkernel", GEMM_QUICK)
    assert all(set(row["median_s"]) == {"numpy", "tl_gemm"} for row in results["rows"])


def test_no_matplotlib_skips_the_plot(tmp_path):
    """Without matplotlib the experiment says so on stdout and writes everything but the plot."""
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('matplotlib hidden by the test')\n")
    out = tmp_path / "out"
    pythonpath = os.pathsep.join(filter(None, [str(shim.parent), os.environ.get("PYTHONPATH")]))
    proc = _run_quick(
        GEMM, out, "--sizes", "64", "--dtypes", "float32", "--layouts", "NN", env={"PYTHONPATH": pythonpath}
    )
    assert "matplotlib is not importable" in proc.stdout
    assert (out / "results.json").exists() and (out / "results.md").exists()
    assert not (out / "plot.png").exists()
    assert any("matplotlib" in note for note in json.loads((out / "results.json").read_text())["notes"])


@pytest.mark.parametrize("script", [FUSION, GEMM])
def test_single_thread_experiments_refuse_other_thread_counts(script):
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", "--threads", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "--threads" in proc.stderr


@pytest.mark.slow  # ~4-7 s: the default run stays under 10 minutes on 2 cores
def test_torch_backward_quick(tmp_path):
    """Derived backward kernels (tensorlang.torch) against PyTorch's backward: checked and timed."""
    pytest.importorskip("torch")
    proc = _run_quick(PAPERS / "2026-11-torch-backward" / "run.py", tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["mode"] == "quick" and results["question"]
    assert {row["kernel"] for row in results["rows"]} == {"matmul", "conv2d", "softmax"}
    for row in results["rows"]:
        assert row["status"]["tensorlang_backward"] == "ok", row["kernel"]
        assert row["median_s"]["torch_backward"] > 0 and row["median_s"]["tensorlang_backward"] > 0
    assert "Unset OPENBLAS_CORETYPE=Haswell" in proc.stdout
    assert (tmp_path / "results.md").read_text().startswith("# ")


@pytest.mark.slow  # ~20 s of worker processes: the slowest test of the default run
def test_stencils_quick(tmp_path):
    """Every stencil as a recurrence and as sweep kernels, 2 threads, checked against the
    reference (NumPy slicing; seidel: the untransformed program); the script exits 1 otherwise."""
    # 2 threads only (the rows compile per thread count; one-thread stencils are tested at length
    # in tests/test_stencils.py and the time-tile tests): about 20 s instead of 40
    proc = _run_quick(PAPERS / "2026-11-stencils" / "run.py", tmp_path, "--threads", "2")
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["experiment"] == "2026-11-stencils" and results["mode"] == "quick"
    assert results["question"] and results["schema"] == "tensorlang-papers/1"
    assert "Unset OPENBLAS_CORETYPE=Haswell" in proc.stdout
    names = {"jacobi-1d", "jacobi-2d", "jacobi-2d-large", "heat-3d", "heat-3d-large", "seidel-2d", "fdtd-2d"}
    assert {(row["kernel"], row["threads"]) for row in results["rows"]} == {(n, 2) for n in names}
    for row in results["rows"]:
        assert row["status"]["tl"] == "ok" and row["throughput"]["tl"] > 0, row["kernel"]
        assert all(s == "ok" for s in row["status"].values()), row
        if row["kernel"] == "seidel-2d":  # no sliced NumPy form and no sweep kernel: said, not faked
            assert "numpy" not in row["median_s"] and "tl-sweep" not in row["median_s"]
        else:
            assert row["ratio_to_numpy"]["tl"] == pytest.approx(
                row["median_s"]["numpy"] / row["median_s"]["tl"]
            )
            assert "tl-sweep" in row["median_s"]
    md = (tmp_path / "results.md").read_text()
    assert md.startswith("# ") and all(n in md for n in names)
    if HAVE_MATPLOTLIB:
        assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stencils_c_limit_quick(tmp_path):
    """jacobi-2d's recurrence against its own schedule in hand-written AVX-512 C: the script
    exits 1 unless the C result equals tensorlang's bit for bit (67x71, T=3 and 9: rows that are
    not whole vectors, a last time tile of one step); without a C compiler or AVX-512 it says why
    and writes nothing."""
    proc = _run_quick(PAPERS / "2026-11-stencils" / "c_limit.py", tmp_path)
    if "c_limit: skipped:" in proc.stdout:
        assert not (tmp_path / "results.json").exists()
        pytest.skip(proc.stdout.strip().splitlines()[-1])
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["experiment"] == "2026-11-stencils/c_limit" and results["mode"] == "quick"
    tl_row, c_row, bound = results["rows"]
    assert tl_row["implementation"] == "tensorlang recurrence" and c_row["implementation"].startswith("C")
    assert all(row["step_gflops"] is None or row["step_gflops"] > 0 for row in results["rows"])
    assert bound["step_s"] > 0 and tl_row["call_s"] > 0 and c_row["call_s"] > 0
    md = (tmp_path / "results.md").read_text()
    assert md.startswith("# ") and "tensorlang recurrence" in md and "rows in L1" in md


def test_stencils_team_waits_quick(tmp_path):
    """The two-thread team's waits, counted by a counter the script adds around the lowering's
    back-off (so a renamed wait breaks this test, not the paper's next run): the script exits 1
    unless the two-thread results equal the one-thread ones bit for bit and match NumPy."""
    # two stencils (a loop team and a team of several pieces: fdtd's), 4 s of compiling each
    _run_quick(PAPERS / "2026-11-stencils" / "team_waits.py", tmp_path, "--stencils", "jacobi-2d,fdtd-2d")
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["experiment"] == "2026-11-stencils/team_waits" and results["mode"] == "quick"
    assert [row["stencil"] for row in results["rows"]] == ["jacobi-2d", "fdtd-2d"]
    assert results["settings"]["tsc_hz"] > 1e8
    for row in results["rows"]:
        assert row["one_thread_s"] > 0 and row["two_threads_s"] > 0 and row["team_waits_thread_s"] >= 0
    md = (tmp_path / "results.md").read_text()
    assert md.startswith("# ") and "waits" in md and "fdtd-2d" in md


def test_stencils_diamonds_quick(tmp_path):
    """Two-thread kernels with diamond and with parallelogram tiles against the one-thread kernel:
    the script exits 1 unless both equal the one-thread result bit for bit and it matches NumPy."""
    _run_quick(PAPERS / "2026-11-stencils" / "diamonds.py", tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["experiment"] == "2026-11-stencils/diamonds" and results["mode"] == "quick"
    assert [row["stencil"] for row in results["rows"]] == ["jacobi-2d", "jacobi-1d"]
    for row in results["rows"]:
        assert row["one_thread_s"] > 0 and row["two_parallelograms_s"] > 0 and row["two_diamonds_s"] > 0
    md = (tmp_path / "results.md").read_text()
    assert md.startswith("# ") and "diamonds" in md and "jacobi-1d" in md


def test_stencils_scaling_quick(tmp_path):
    """The stencil's two-thread gain next to the pair's ceiling (two one-thread calls at once):
    the script exits 1 unless two threads and each call of the pair equal one thread bit for
    bit and one thread matches NumPy."""
    _run_quick(PAPERS / "2026-11-stencils" / "scaling.py", tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["experiment"] == "2026-11-stencils/scaling" and results["mode"] == "quick"
    [row] = results["rows"]
    assert row["stencil"] == "jacobi-2d" and row["one_thread_s"] > 0 and row["pair_s"] > 0
    for key in ("gain", "ceiling", "efficiency"):
        lo, mid, hi = row[f"{key}_quartiles"]
        assert 0 < lo <= mid <= hi and row[key] > 0
    assert 0 <= row["rounds_gain_at_least_1_8"] <= row["rounds"] == 3
    roomy = row["rounds_ceiling_roomy"]
    assert 0 <= roomy <= 3 and (row["gain_where_ceiling_roomy"] is None) == (roomy == 0)
    md = (tmp_path / "results.md").read_text()
    assert md.startswith("# ") and "ceiling" in md and "jacobi-2d" in md
