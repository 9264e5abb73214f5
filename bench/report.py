"""The rows of the bench table and how they are rendered (markdown, the same text docs/bench.md shows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Row:
    """One line of the bench table.

    Attributes
    ----------
    metric:
        What is measured, with its unit.
    ours:
        The product's figure.
    anchor:
        What it is compared with (Step Functions, the minimum, the machine's ceiling), or None.
    ratio:
        ``ours / anchor`` (or the ratio the metric defines), or None for a plain figure.
    target:
        The target as text (``<= 0.20``), or "" when the row has none.
    met:
        Whether the target is met; None when the row has no target.
    """

    metric: str
    ours: float | str
    anchor: float | str | None = None
    ratio: float | None = None
    target: str = ""
    met: bool | None = None

    @classmethod
    def compare(
        cls, metric: str, ours: float, anchor: float, *, at_most: float | None = None, at_least: float | None = None
    ) -> Row:
        """A row whose ratio is ``ours / anchor``, checked against ``at_most`` or ``at_least`` when given."""
        ratio = ours / anchor if anchor else float("inf")
        return cls.with_ratio(metric, ours, anchor, ratio, at_most=at_most, at_least=at_least)

    @classmethod
    def with_ratio(
        cls,
        metric: str,
        ours: float | str,
        anchor: float | str | None,
        ratio: float,
        *,
        at_most: float | None = None,
        at_least: float | None = None,
    ) -> Row:
        """A row with a ratio computed by the caller, checked against ``at_most`` or ``at_least`` when given."""
        if at_most is not None:
            return cls(metric, ours, anchor, ratio, f"<= {at_most:g}", ratio <= at_most)
        if at_least is not None:
            return cls(metric, ours, anchor, ratio, f">= {at_least:g}", ratio >= at_least)
        return cls(metric, ours, anchor, ratio)

    def cells(self) -> list[str]:
        met = "" if self.met is None else ("yes" if self.met else "**no**")
        return [self.metric, _fmt(self.ours), _fmt(self.anchor), _fmt(self.ratio, ratio=True), self.target, met]

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "ours": self.ours,
            "anchor": self.anchor,
            "ratio": self.ratio,
            "target": self.target,
            "met": self.met,
        }


HEADER = ["metric", "ours", "anchor", "ratio", "target", "met?"]


def _fmt(value: float | str | None, *, ratio: bool = False) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if ratio:
        return f"{value:.3f}"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:,.2f}"
    return f"{value:.3g}"


def markdown(rows: list[Row]) -> str:
    """The rows as one markdown table."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join(["---"] + ["---:"] * 3 + ["---", "---"]) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row.cells()) + " |" for row in rows]
    return "\n".join(lines)
