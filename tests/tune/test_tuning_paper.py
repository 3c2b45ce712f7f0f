"""papers/2026-11-tuning/run.py --quick: tunes two tiny kernels, checks them against NumPy, follows papers/paperbench.py's convention."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[2] / "papers" / "2026-11-tuning" / "run.py"


@pytest.mark.slow  # ~4-7 s: the default run stays under 10 minutes on 2 cores
def test_tuning_paper_quick(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(RUN), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["experiment"] == "2026-11-tuning" and results["mode"] == "quick" and results["question"]
    assert len(results["rows"]) == 2
    for row in results["rows"]:
        assert row["status"] == {"default": "ok", "tuned": "ok"}
        assert row["tuner"]["trials"] >= 1 and row["convergence_s"]
        assert row["tuner"]["best_s"] <= row["tuner"]["default_s"]
    assert (tmp_path / "results.md").read_text().startswith("# ")
