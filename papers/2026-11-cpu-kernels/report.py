"""Render results.json as a Markdown table, a bar chart of ratios to NumPy, and the README's findings."""

from __future__ import annotations

import re
from pathlib import Path

LABELS = {
    "numpy": "NumPy",
    "tensorlang-1t": "tensorlang (1 thread)",
    "tensorlang": "tensorlang (default threads)",
    "torch": "torch",
    "numba": "numba",
}
README_START = "<!-- results:start -->"
README_END = "<!-- results:end -->"


def _fmt_rate(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def _fmt_ratio(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:.2f}×" if x >= 0.1 else f"{x:.3f}×"


def _fmt_seconds(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x * 1e3:.0f} ms" if x < 1 else f"{x:.1f} s"


def _cell(res: dict | None, show_ratio: bool) -> str:
    if res is None:
        return "–"
    status = res.get("status")
    if status == "error":
        return "**error**"
    rate = _fmt_rate(res.get("throughput"))
    text = rate
    if show_ratio and res.get("ratio_to_numpy") is not None:
        text += f" ({_fmt_ratio(res['ratio_to_numpy'])})"
    if status == "wrong":
        text += " **wrong**"
    return text


def implementations(results: dict) -> list[str]:
    """Implementations present in any kernel, in a fixed order."""
    seen = []
    for k in results["kernels"]:
        for name in k["implementations"]:
            if name not in seen:
                seen.append(name)
    order = list(LABELS)
    return sorted(seen, key=lambda n: order.index(n) if n in order else len(order))


def markdown(results: dict) -> str:
    """The results table (throughput and ratio to NumPy), first-call times and the call overhead."""
    impls = implementations(results)
    lines = []
    head = ["kernel", "size", "unit"] + [LABELS.get(n, n) for n in impls] + ["tensorlang compile + JIT"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join(["---"] * 3 + ["---:"] * (len(impls) + 1)) + "|")
    for k in results["kernels"]:
        row = [f"`{k['name']}`", k["shape"], k["unit"]]
        for name in impls:
            row.append(_cell(k["implementations"].get(name), show_ratio=name != "numpy"))
        tl = k["implementations"].get("tensorlang-1t") or {}
        row.append(_fmt_seconds(tl.get("compile_jit_s", tl.get("first_call_s"))))
        lines.append("| " + " | ".join(row) + " |")
    tl_info = results["machine"].get("tensorlang") or {}
    commit = tl_info.get("git_commit") or "?"
    if tl_info.get("git_dirty"):
        commit += " + local changes"
    out = [
        f"Run {results.get('timestamp', '?')}, tensorlang {commit}. "
        f"Mode: **{results['mode']}**, {results['settings']['repeats']} interleaved repeats (median), "
        f"{results['machine'].get('cpu_model', '?')}, {results['machine'].get('usable_cpus', '?')} cores. "
        "Cells: throughput (ratio to NumPy; > 1 = faster than NumPy). "
        "Compile + JIT = time of `tl.compile` plus the first call on a fresh `Options(threads=1)` kernel, "
        "less one cached call (results.json keeps the raw `first_call_s`).",
        "",
        *lines,
        "",
    ]
    ov = results.get("call_overhead") or {}
    if ov.get("tensorlang_us") is not None:
        out.append(
            f"Cached-call overhead (1-element add): tensorlang {ov['tensorlang_us']:.1f} µs per call, "
            f"NumPy `np.add` {ov['numpy_us']:.2f} µs; compile + first call of that kernel "
            f"{_fmt_seconds(ov.get('first_call_s'))}."
        )
    elif ov.get("error"):
        out.append(f"Cached-call overhead: **error** ({ov['error']}).")
    failures = results["summary"]["failures"]
    out.append("")
    if failures:
        out.append(
            "Failures: "
            + "; ".join(f"`{f['kernel']}` {f['implementation']}: {f['status']}" for f in failures)
            + "."
        )
    else:
        out.append("Every implementation matched the NumPy reference.")
    if results.get("env_note"):
        out += ["", results["env_note"]]
    for note in results.get("notes", []):
        out.append(f"- {note}")
    return "\n".join(out) + "\n"


def plot(results: dict, path: Path) -> str | None:
    """A grouped bar chart of the ratio to NumPy per kernel (log scale); returns a note if skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except Exception as exc:  # noqa: BLE001 - matplotlib is optional
        return f"plot.png not written: matplotlib is not importable ({type(exc).__name__})"
    impls = [n for n in implementations(results) if n != "numpy"]
    kernels = results["kernels"]
    width = 0.8 / max(1, len(impls))
    fig, ax = plt.subplots(figsize=(max(8.0, 0.9 * len(kernels) + 2), 4.8))
    for i, name in enumerate(impls):
        xs, ys = [], []
        for j, k in enumerate(kernels):
            res = k["implementations"].get(name) or {}
            if res.get("ratio_to_numpy"):
                xs.append(j + (i - (len(impls) - 1) / 2) * width)
                ys.append(res["ratio_to_numpy"])
        ax.bar(xs, ys, width=width, label=LABELS.get(name, name))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}×"))
    ax.set_xticks(range(len(kernels)))
    ax.set_xticklabels([k["name"] for k in kernels], rotation=35, ha="right")
    ax.set_ylabel("speed relative to NumPy (> 1 = faster)")
    ax.set_title(f"tensorlang CPU kernels vs NumPy ({results['mode']} mode)")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def update_readme(readme: Path, table_md: str) -> bool:
    """Replace the text between the results markers of the README; False if the markers are missing."""
    text = readme.read_text()
    pattern = re.compile(re.escape(README_START) + r".*?" + re.escape(README_END), re.S)
    if not pattern.search(text):
        return False
    block = f"{README_START}\n{table_md.rstrip()}\n{README_END}"
    readme.write_text(pattern.sub(lambda _m: block, text))
    return True
