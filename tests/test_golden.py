"""Golden files: the printable stages of a dozen kernels, compared with tests/golden/<kernel>.<stage>.

Every change to the pipeline's output shows up in review as a diff of these files. After an
intended change, rewrite them with `python -m pytest tests/test_golden.py --accept` and read the
diff before committing. Host facts (cache sizes, AVX-512) and the thread count are pinned so that
the files do not depend on the machine that runs the tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import codegen.host.blocking
import scheduler.postpass
import tensorlang as tl

GOLDEN = Path(__file__).resolve().parent / "golden"
KERNELS = sorted(p.stem for p in GOLDEN.glob("*.tc"))
STAGES = ("ir", "scop", "schedule", "plan", "loops")
PINNED_CACHES = {1: 48 << 10, 2: 2 << 20, 3: 32 << 20}  # bytes per level, as on the reference host


@pytest.fixture
def pinned_host(monkeypatch):
    monkeypatch.setattr(scheduler.postpass, "cache_size", PINNED_CACHES.__getitem__)
    monkeypatch.setattr(scheduler.postpass, "cache_ways", lambda level: 12)  # a 12-way L1d
    monkeypatch.setattr(codegen.host.blocking, "cache_size", PINNED_CACHES.__getitem__)
    monkeypatch.setattr(codegen.host.blocking, "host_has_avx512", lambda: True)


def _source_and_sizes(kernel: str) -> tuple[str, dict[str, int]]:
    text = (GOLDEN / f"{kernel}.tc").read_text()
    header = text.splitlines()[0]
    assert header.startswith("# sizes:"), f"{kernel}.tc must start with '# sizes: N=.. M=..'"
    sizes = {k: int(v) for k, v in (item.split("=") for item in header.split(":", 1)[1].split())}
    return text, sizes


def stage_text(kernel: str, stage: str) -> str:
    source, sizes = _source_and_sizes(kernel)
    k = tl.compile(source, options=tl.Options(threads=2))
    return k.inspect(stage, sizes=sizes if stage in ("plan", "loops") else None).rstrip("\n") + "\n"


def test_every_kernel_has_its_golden_files():
    assert len(KERNELS) >= 8
    for kernel in KERNELS:
        for stage in STAGES:
            assert (GOLDEN / f"{kernel}.{stage}").exists(), f"missing {kernel}.{stage}: run with --accept"


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_stage_matches_golden(kernel, stage, pinned_host, request):
    text = stage_text(kernel, stage)
    path = GOLDEN / f"{kernel}.{stage}"
    if request.config.getoption("--accept"):
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"{path.name} does not exist; run `python -m pytest tests/test_golden.py --accept`")
    expected = path.read_text()
    assert text == expected, f"{path.name} changed; if intended, rerun with --accept and review the diff"


@pytest.mark.parametrize("kernel", KERNELS[:3])
def test_stage_text_is_deterministic(kernel, pinned_host):
    """The same program, options and sizes give the same text (the cache key relies on it)."""
    assert stage_text(kernel, "loops") == stage_text(kernel, "loops")
