"""papers/2026-11-direct-conv runs in --quick mode and writes the convention's outputs
(papers/paperbench.py): results.json with checked rows, results.md, plot.png where matplotlib is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

RUN = Path(__file__).resolve().parents[1] / "papers" / "2026-11-direct-conv" / "run.py"


def test_direct_conv_quick(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(RUN), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["mode"] == "quick" and results["experiment"] == "2026-11-direct-conv"
    assert results["rows"] and all(s == "ok" for row in results["rows"] for s in row["status"].values())
    assert {"numpy", "tl", "tl-gemm"} <= set(results["rows"][0]["median_s"])
    assert (tmp_path / "results.md").read_text().startswith("# Direct convolution")
