"""Result tables: every figure as the median of rounds with its spread (min-max), and its ratio
to a baseline measured in the same run; targets judged PASS/FAIL on those ratios."""

from __future__ import annotations

import statistics


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def spread(values, fmt: str = "{:.2f}") -> str:
    """`` (min A, max B, n=N)`` for notes; empty for a single value."""
    values = [v for v in values if v is not None]
    if len(values) <= 1:
        return ""
    return f" (min {fmt.format(min(values))}, max {fmt.format(max(values))}, n={len(values)})"


def cell(values, fmt: str, base=None) -> str:
    """``median [min-max] ratio`` of one method's rounds; ``base``: the baseline's median."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    mid = statistics.median(values)
    text = fmt.format(mid)
    if len(values) > 1:
        text += f" [{fmt.format(min(values))}-{fmt.format(max(values))}]"
    if base:
        text += f" {ratio(mid / base)}"
    return text


def ratio(x: float) -> str:
    """``1.36x``; two significant digits below 0.1 (``0.0018x``, not ``0.00x``)."""
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.2g}x"


def print_table(columns: list[str], rows: list[tuple[str, str, dict, str | None]], title: str = "figure") -> None:
    """Markdown: one row per figure ``(label, fmt, {column: [values]}, baseline column or None)``,
    one column per method; ratios are to the baseline's median."""
    print(f"| {title} | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for label, fmt, values, base_col in rows:
        if not any(v is not None for col in columns for v in values.get(col, [])):
            continue
        base = median(values.get(base_col, [])) if base_col else None
        cells = [cell(values.get(c, []), fmt, None if c == base_col else base) for c in columns]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print(flush=True)


def print_rows(rows) -> None:
    """A results table of (figure, value, notes) as Markdown."""
    print("| figure | value | notes |\n|---|---:|---|")
    for name, value, note in rows:
        print(f"| {name} | {value} | {note} |")
    print(flush=True)


def number(v: float) -> str:
    """Whole numbers with separators from 100 up, three significant digits below."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def target(label: str, method: str, value, other, rule: str) -> dict:
    """A target on the ratio ``value / other`` of two medians; ``rule`` like ``>= 0.9`` or ``<= 2``."""
    if value is None or not other:
        return {"target": label, "method": method, "value": "not measured", "rule": rule, "result": "n/a"}
    op, limit = rule.split()
    ratio = value / other
    ok = ratio >= float(limit) if op == ">=" else ratio <= float(limit) if op == "<=" else ratio > float(limit)
    return {"target": label, "method": method, "value": f"{number(value)} / {number(other)} = {ratio:.2f}x",
            "rule": rule + "x", "result": "PASS" if ok else "FAIL"}


def absolute(label: str, method: str, value, rule: str, unit: str = "") -> dict:
    """A target on a measured value itself (e.g. ``<= 25`` µs)."""
    if value is None:
        return {"target": label, "method": method, "value": "not measured", "rule": rule, "result": "n/a"}
    op, limit = rule.split()
    ok = value <= float(limit) if op == "<=" else value >= float(limit)
    text = f"{value:.3f}" if unit == "x" else number(value)  # multiples of a size: 1.012x, not 1x
    return {"target": label, "method": method, "value": f"{text}{unit}", "rule": rule + unit,
            "result": "PASS" if ok else "FAIL"}


def print_targets(targets: list[dict], heading: str) -> None:
    print(f"| {heading} | method | measured (medians) | rule | result |\n|---|---|---:|---|---|")
    for t in targets:
        print(f"| {t['target']} | {t['method']} | {t['value']} | {t['rule']} | {t['result']} |")
    print(flush=True)
