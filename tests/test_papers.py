"""The papers' benchmark scripts run in quick mode and every tensorlang kernel matches NumPy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_KERNELS = ROOT / "papers" / "2026-11-cpu-kernels" / "run.py"


def _run_quick(script: Path, out: Path) -> None:
    """Run a benchmark script in quick mode; it exits non-zero when a result is wrong."""
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, f"{script.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_cpu_kernels_quick(tmp_path):
    _run_quick(CPU_KERNELS, tmp_path)
    results_file = tmp_path / "results.json"
    assert results_file.exists()
    assert (tmp_path / "results.md").exists()
    results = json.loads(results_file.read_text())
    assert results["mode"] == "quick"
    assert results["kernels"], "no kernel was run"

    problems = []
    for kernel in results["kernels"]:
        impls = kernel["implementations"]
        assert impls["numpy"]["correct"], (
            f"{kernel['name']}: the NumPy implementation disagrees with its oracle"
        )
        for variant in ("tensorlang-1t", "tensorlang"):
            res = impls.get(variant)
            if res is None or res.get("status") != "ok" or not res.get("correct"):
                detail = (res or {}).get("error") or f"max abs err {(res or {}).get('max_abs_err')}"
                problems.append(f"{kernel['name']} {variant}: {(res or {}).get('status')}: {detail}")
            elif not res.get("median_s"):
                problems.append(f"{kernel['name']} {variant}: not timed")
    overhead = results["call_overhead"]
    if not overhead.get("correct"):
        problems.append(f"call overhead kernel: {overhead.get('error', 'wrong result')}")
    assert not problems, "tensorlang results not verified against NumPy:\n" + "\n".join(problems)
    assert results["summary"]["tensorlang_all_correct"]


FUSION = ROOT / "papers" / "2026-11-fusion" / "run.py"


def test_fusion_benchmark_quick(tmp_path):
    """Every fusion strategy of every benchmark kernel matches NumPy (the script exits 1 otherwise)."""
    _run_quick(FUSION, tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    assert {k["kernel"] for k in results["kernels"]} >= {"softmax", "layernorm", "mlp3", "chain"}
    for kernel in results["kernels"]:
        assert all(kernel["correct"].values()), kernel["kernel"]
