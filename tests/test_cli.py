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


# ---------------------------------------------------------------- version


def _pyproject_version() -> str:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_version_attribute_is_pyprojects_and_loads_no_backend():
    code = "import sys, tensorlang; print(tensorlang.__version__); print('islpy' in sys.modules or 'llvmlite' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [_pyproject_version(), "False"]


def test_version_flag(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"tensorlang {_pyproject_version()}"
    proc = subprocess.run(
        [sys.executable, "-m", "tensorlang", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == f"tensorlang {_pyproject_version()}"


# ---------------------------------------------------------------- option flags

MATMUL_SIZES = ["--size", "M=64", "--size", "K=64", "--size", "N=64"]


def _emit_out(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0, capsys.readouterr().err
    return capsys.readouterr().out


@pytest.fixture
def softmax_file(tmp_path):
    from conftest import SOFTMAX

    path = tmp_path / "softmax.tc"
    path.write_text(SOFTMAX)
    return str(path)


def test_fusion_flag_changes_the_schedule(softmax_file, capsys):
    default = _emit_out(capsys, softmax_file, "--emit", "schedule")
    fused = _emit_out(capsys, softmax_file, "--emit", "schedule", "--fusion", "max")
    split = _emit_out(capsys, softmax_file, "--emit", "schedule", "--fusion", "none")
    assert split != fused and split != default


def test_tile_flag_changes_the_plan(capsys):
    default = _emit_out(capsys, EXAMPLE, "--emit", "plan", *MATMUL_SIZES)
    tiled = _emit_out(capsys, EXAMPLE, "--emit", "plan", *MATMUL_SIZES, "--tile", "8,8,8")
    assert "c0 += 8" in tiled and "c0 += 8" not in default
    assert _emit_out(capsys, EXAMPLE, "--emit", "plan", *MATMUL_SIZES, "--tile", "8") == tiled


def test_no_specialize_and_fast_math_flags_change_the_plan(capsys):
    default = _emit_out(capsys, EXAMPLE, "--emit", "plan", *MATMUL_SIZES)
    assert "(M=64, K=64, N=64)" in default and "fast-math" not in default
    generic = _emit_out(capsys, EXAMPLE, "--emit", "plan", *MATMUL_SIZES, "--no-specialize")
    assert "(symbolic)" in generic
    assert "// fast-math" in _emit_out(capsys, EXAMPLE, "--emit", "plan", *MATMUL_SIZES, "--fast-math")


def test_run_passes_every_flag_to_the_options(monkeypatch, capsys):
    from codegen import driver

    seen = []
    real = driver.compile

    def spy(*args, **kwargs):
        seen.append(kwargs["options"])
        return real(*args, **kwargs)

    monkeypatch.setattr(driver, "compile", spy)
    argv = ["run", EXAMPLE, "--shape", "A=8x12", "--shape", "B=12x10", "--threads", "2", "--fusion", "max"]
    argv += ["--tile", "4,4,4", "--no-specialize", "--fast-math"]
    assert main(argv) == 0, capsys.readouterr().err
    assert "C: float32[8, 10]" in capsys.readouterr().out
    (options,) = seen
    assert (options.threads, options.fusion, options.tile) == (2, "max", (4, 4, 4))
    assert options.specialize is False and options.fast_math is True


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--threads", "two"], "--threads 'two': expected an integer"),
        (["--threads", "0"], "--threads"),
        (["--fusion", "most"], "--fusion 'most': choose one of auto, max, none"),
        (["--tile", "8,x"], "--tile '8,x'"),
        (["--tile", "0"], "--tile"),
    ],
)
@pytest.mark.parametrize("form", ["emit", "run"])
def test_bad_option_values_are_clean_errors(flags, message, form, capsys):
    argv = (
        [EXAMPLE, "--emit", "ir"]
        if form == "emit"
        else ["run", EXAMPLE, "--shape", "A=2x3", "--shape", "B=3x2"]
    )
    assert main(argv + flags) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


# ---------------------------------------------------------------- names of sizes and shapes


def test_unknown_size_name_is_an_error(capsys):
    assert main([EXAMPLE, "--emit", "loops", "--size", "M=4", "--size", "K=3", "--size", "n=2"]) == 1
    err = capsys.readouterr().err
    assert "--size: matmul has no size named n; its sizes are: M, K, N" in err


def test_unknown_shape_name_is_an_error(capsys):
    assert main(["run", EXAMPLE, "--shape", "A=8x12", "--shape", "b=12x10"]) == 1
    err = capsys.readouterr().err
    assert "--shape: matmul has no input named b; its inputs are: A, B" in err


# ---------------------------------------------------------------- random inputs


class _RecordingGenerator:
    """A numpy Generator that records the dtype of every array it makes."""

    def __init__(self, seed):
        import numpy as np

        self._rng = np.random.default_rng(seed)
        self.made = []

    def __getattr__(self, name):
        method = getattr(self._rng, name)

        def call(*args, **kwargs):
            result = method(*args, **kwargs)
            self.made.append(result.dtype)
            return result

        return call


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint16", "int64", "bool"])
def test_run_makes_inputs_in_the_target_dtype(dtype):
    import numpy as np

    from tensorlang.cli import _random_input
    from tensorlang.dtypes import ScalarType

    class Tensor:  # what _random_input reads of an input
        pass

    tensor = Tensor()
    tensor.dtype = ScalarType(dtype)
    rng = _RecordingGenerator(0)
    value = _random_input(rng, tensor, (5, 7))
    assert value.dtype == np.dtype(dtype) and value.shape == (5, 7)
    assert rng.made == [np.dtype(dtype)]  # no float64 (or int64) array first
    if value.dtype.kind == "f":
        assert -1 <= value.min() and value.max() < 1
