"""The command line: every stage prints, `run` runs, and errors exit non-zero without a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tensorlang.cli import EMIT_STAGES, main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "matmul.tc")


@pytest.mark.parametrize("stage", EMIT_STAGES)
def test_emit_every_stage(stage, capsys):
    assert main([EXAMPLE, "--emit", stage]) == 0
    assert capsys.readouterr().out.strip()


def test_emit_specialised(capsys):
    assert main([EXAMPLE, "--emit", "loops", "--size", "M=4", "--size", "K=3", "--size", "N=2"]) == 0
    assert "c0 <= 3" in capsys.readouterr().out


def test_run_and_bench(capsys):
    assert main(["run", EXAMPLE, "--shape", "A=8x12", "--shape", "B=12x10", "--bench", "--repeat", "3"]) == 0
    out = capsys.readouterr().out
    assert "C: float32[8, 10]" in out and "median" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", EXAMPLE, "--shape", "A=8x12"], "give the shape of B"),
        (["run", EXAMPLE, "--shape", "A=8x12", "--shape", "B=13x10"], "mismatched sizes"),
        (["run", EXAMPLE, "--shape", "A=8xq", "--shape", "B=12x10"], "dimensions must be integers"),
        (["/nonexistent.tc", "--emit", "ir"], "cannot read"),
    ],
)
def test_errors_are_reported_not_raised(argv, message, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_source_error_shows_caret(tmp_path, capsys):
    bad = tmp_path / "bad.tc"
    bad.write_text("def f(float(N) A) -> (B) {\n  B(i) = A(i);\n}\n")
    assert main([str(bad), "--emit", "ir"]) == 1
    err = capsys.readouterr().err
    # the file's own path, so that editors can jump to the line (it once said `<source>:2:`)
    assert f"{bad}:2:" in err and "<source>" not in err
    assert "^" in err


def test_warnings_name_the_file_not_the_compiler(tmp_path, capsys):
    src = tmp_path / "acc.tc"
    src.write_text("def f(float(N) A) -> (B) {\n  B(i) += A(i)\n}\n")
    assert main(["run", str(src), "--shape", "A=3"]) == 0
    err = capsys.readouterr().err
    assert f"warning: {src}:2:3: Reduction without initialization" in err
    assert "checker.py" not in err and "<source>" not in err


def test_compile_filename_locates_api_errors():
    import tensorlang as tl

    with pytest.raises(tl.ParseError) as info:
        tl.compile("def f(float(N) A) -> (B) {\n  B(i) = A(i) +\n}\n", filename="model/f.tc")
    assert str(info.value).startswith("model/f.tc:3:1:")
    with pytest.raises(tl.TensorLangError, match="filename= must be a str"):
        tl.compile("def f(float(N) A) -> (B) { B(i) = A(i) }", filename=3)


def test_python_dash_m(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "tensorlang", EXAMPLE, "--emit", "ir"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "def matmul" in proc.stdout
