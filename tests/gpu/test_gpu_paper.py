"""papers/2026-11-gpu/run.py: without a GPU it measures nothing and says so (exit code 3); its
Markdown and plot render from a results record; with a GPU (marked `gpu`) --quick runs and every
tensorlang result matches PyTorch eager."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from codegen.gpu import runtime

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "papers" / "2026-11-gpu" / "run.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_paper_run", RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(runtime.unavailable_reason() is None, reason="a GPU is present")
def test_without_a_gpu_nothing_is_measured(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, str(RUN), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "no CUDA GPU here, nothing measured" in proc.stdout
    assert not (tmp_path / "results.json").exists()


def test_markdown_and_plot_render(tmp_path) -> None:
    run = _load()
    results = run.pb.new_results(run.EXPERIMENT, run.QUESTION, True, {"gpu": {"name": "test"}})
    results["rows"].append(
        {
            "kernel": "softmax 257x129",
            "unit": "GB/s",
            "median_s": {"torch": 1e-5, "torch.compile": 2e-5, "tl": 4e-5},
            "ratio_to_torch_eager": {"torch": 1.0, "torch.compile": 0.5, "tl": 0.25},
            "throughput": {"torch": 26.5, "torch.compile": 13.2, "tl": 6.6},
            "status": {"torch": "ok", "torch.compile": "ok", "tl": "ok"},
            "tl_plan": ["// cuda phase 0 (S0): one thread per c0[257]"],
        }
    )
    text = run.markdown(results)
    assert "| softmax 257x129 |" in text and "0.25×" in text and "cuda phase 0" in text
    note = run.plot(results, tmp_path / "plot.png")
    assert note is None and (tmp_path / "plot.png").stat().st_size > 0 or "matplotlib" in note


@pytest.mark.gpu
@pytest.mark.skipif(runtime.unavailable_reason() is not None, reason="no GPU")
def test_quick_run_on_the_gpu(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, str(RUN), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert len(results["rows"]) == 5
    for row in results["rows"]:
        assert row["status"]["tl"] == "ok", row
