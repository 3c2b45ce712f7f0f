"""Render results.json (schema papers/paperbench.py) as Markdown tables, a plot of ratios to NumPy, and
the README's findings."""

from __future__ import annotations

import re
from pathlib import Path

import paperbench as pb

LABELS = {"numpy": "NumPy", "tensorlang": "tensorlang", "numba": "numba", "torch": "torch"}
ORDER = list(LABELS)
README_START = "<!-- results:start -->"
README_END = "<!-- results:end -->"


def implementations(results: dict) -> list[str]:
    """Implementations present in any row, in a fixed order."""
    seen = {impl for row in results["rows"] for impl in row["status"]}
    return sorted(seen, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))


def _cell(row: dict, impl: str) -> str:
    status = row["status"].get(impl)
    if status is None:
        return "–"
    if status == "error":
        return "**error**"
    text = pb.fmt_rate(row["throughput"].get(impl))
    if impl != "numpy" and row["ratio_to_numpy"].get(impl) is not None:
        text += f" ({pb.fmt_ratio(row['ratio_to_numpy'][impl])})"
    if status == "wrong":
        text += " **wrong**"
    return text


def _threads_label(t: int) -> str:
    return f"{t} thread{'s' if t != 1 else ''}"


def summary_table(results: dict) -> list[str]:
    """tensorlang's ratio to NumPy per kernel and thread count, and both scalings."""
    threads = results["settings"]["threads"]
    rows = {(r["kernel"], r["threads"]): r for r in results["rows"]}
    kernels = list(dict.fromkeys(r["kernel"] for r in results["rows"]))
    head = ["kernel"] + [f"tensorlang ÷ NumPy, {_threads_label(t)}" for t in threads]
    multi = [t for t in threads if t != 1] if 1 in threads else []
    for t in multi:
        head += [f"tensorlang {t} threads vs 1", f"NumPy {t} threads vs 1"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name in kernels:
        cells = [f"`{name}`"]
        for t in threads:
            row = rows.get((name, t))
            ratio = row["ratio_to_numpy"].get("tensorlang") if row else None
            cells.append(
                pb.fmt_ratio(ratio)
                + (" **wrong**" if row and row["status"].get("tensorlang") == "wrong" else "")
            )
        for t in multi:
            one, many = rows.get((name, 1)), rows.get((name, t))
            for impl in ("tensorlang", "numpy"):
                a = one["median_s"].get(impl) if one else None
                b = many["median_s"].get(impl) if many else None
                cells.append(pb.fmt_ratio(a / b) if a and b else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def thread_table(results: dict, threads: int) -> list[str]:
    impls = implementations(results)
    head = ["kernel", "size", "unit"] + [LABELS.get(n, n) for n in impls]
    if threads == 1:
        head.append("tensorlang compile + JIT (cold cache)")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 3 + ["---:"] * (len(head) - 3)) + "|"]
    for row in results["rows"]:
        if row["threads"] != threads:
            continue
        cells = [f"`{row['kernel']}`", row["shape"], row["unit"]] + [_cell(row, n) for n in impls]
        if threads == 1:
            tl = row["details"].get("tensorlang", {})
            cells.append(pb.fmt_seconds(tl.get("compile_jit_s", tl.get("first_call_s"))))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(results: dict) -> str:
    """The summary table, one table per thread count, call overhead, failures, environment, peers."""
    st = results["settings"]
    out = [
        pb.header_line(results),
        "",
        f"Medians of {st['repeats']} interleaved samples per implementation, taken over {st['rounds']} "
        "round(s) of worker processes (one process per thread count and group: NumPy and tensorlang "
        "interleaved on 1 thread; NumPy/OpenBLAS, tensorlang and each peer alone on more). "
        "Ratios are to NumPy at the same thread count (> 1 = faster than NumPy).",
        "",
        "**Summary** (tensorlang's ratio to NumPy; scaling = time on 1 thread ÷ time on N threads):",
        "",
        *summary_table(results),
    ]
    for t in st["threads"]:
        out += [
            "",
            f"**{_threads_label(t)}** — throughput (ratio to NumPy on {_threads_label(t)}):",
            "",
            *thread_table(results, t),
        ]
    out.append("")
    ov = results.get("call_overhead") or {}
    if ov.get("tensorlang_us") is not None:
        out.append(
            f"Cached-call overhead (1-element add): tensorlang {ov['tensorlang_us']:.1f} µs per call, "
            f"NumPy `np.add` {ov['numpy_us']:.2f} µs; compile + first call of that kernel "
            f"{pb.fmt_seconds(ov.get('first_call_s'))} (the process's first compilation)."
        )
    elif ov.get("error"):
        out.append(f"Cached-call overhead: **error** ({ov['error'].splitlines()[0]}).")
    foreign = [
        p["foreign_cores"] for p in results.get("processes_run", []) if p.get("foreign_cores") is not None
    ]
    if foreign:
        out += [
            "",
            f"Other processes on the machine used {min(foreign):.2f}–{max(foreign):.2f} cores on average while "
            f"the {len(foreign)} worker processes ran (per process in results.json, `processes_run`).",
        ]
    failures = results["summary"].get("failures", [])
    out.append("")
    if failures:
        out.append(
            "Failures: "
            + "; ".join(
                f"`{f['kernel']}` {f['implementation']} @ {f['threads']}t: {f['status']}" for f in failures
            )
            + "."
        )
    else:
        out.append("Every implementation matched the NumPy reference (and NumPy its float64 oracle).")
    out.append("")
    for note in results.get("notes", []):
        out.append(f"- {note}")
    return "\n".join(out) + "\n"


def plot(results: dict, path: Path) -> str | None:
    impls = [n for n in implementations(results) if n != "numpy"]
    return pb.plot_ratios(results, path, "tensorlang CPU kernels vs NumPy", impls, LABELS)


def update_readme(readme: Path, table_md: str) -> bool:
    """Replace the text between the results markers of the README; False if the markers are missing."""
    text = readme.read_text()
    pattern = re.compile(re.escape(README_START) + r".*?" + re.escape(README_END), re.S)
    if not pattern.search(text):
        return False
    block = f"{README_START}\n{table_md.rstrip()}\n{README_END}"
    readme.write_text(pattern.sub(lambda _m: block, text))
    return True
