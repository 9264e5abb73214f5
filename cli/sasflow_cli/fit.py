"""Tables that fit the terminal they are printed on: what matters stays whole, the rest gives way first.

A `FitTable` is laid out when rich renders it, for the width it is given (the terminal's, a ``Live`` region's, a
test's fixed ``Console(width=80)``):

- ``whole`` columns (a workflow id, a status, an error code, a step name) are never cut, wrapped or dropped: an id
  can be copied, a status read;
- ``wrap`` columns (an error's message, a history detail, a reason) are never dropped either; they take the width
  that is left, at least their ``minimum`` (and their longest word, up to `LONGEST_WORD`), and wrap between words;
- ``optional`` columns give way, lowest ``drop`` first, until the rest fits; one with ``into`` is folded into that
  column's cells (after it, or ``before`` it, joined by ``sep``) instead of being lost.

If even the whole and wrap columns do not fit, each row is printed as ``column: value`` lines (an id stays whole at
any width). ``wide=True`` keeps every column, wraps nothing and prints at the table's natural width, one line a row,
for ``less -S`` and grep: print it with ``crop=False`` (``sasflow ... --wide``).

The gutter between columns is two spaces and there are no vertical borders, so what a mouse selects is the value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

__all__ = ["GUTTER", "LONGEST_WORD", "Col", "FitTable"]

#: Columns between two cells: one of padding and one of the (blank) vertical border.
GUTTER = 2
#: A wrap column's minimum grows to its longest word (an error code) up to this many columns.
LONGEST_WORD = 28


@dataclass(frozen=True)
class Col:
    """One column: its header, how it gives way (see the module docstring) and its alignment."""

    header: str
    kind: Literal["whole", "wrap", "optional"] = "optional"
    drop: int = 0
    into: str | None = None
    sep: str = "\n"
    before: bool = False
    minimum: int = 12
    justify: Literal["left", "right"] = "left"


@dataclass
class FitTable:
    """Rows of cells (``Text`` by column header) under ``columns``, laid out for the width it is rendered at."""

    columns: Sequence[Col]
    rows: Sequence[Mapping[str, Text]]
    title: str | None = None
    wide: bool = False
    #: The cell folded into another column when a row's own cell would not do (e.g. a status said once).
    folds: Sequence[Mapping[str, Text]] = field(default_factory=list)
    #: A style for each row (e.g. red for an event that failed).
    styles: Sequence[str] = field(default_factory=list)

    def layout(self, width: int) -> tuple[list[Col], list[dict[str, Text]]] | None:
        """The columns kept and the rows' cells (folds applied) for ``width`` columns; None if nothing fits.

        Optional columns are dropped, lowest ``drop`` first, until the rest fits. A fold can widen the column it
        joins: when the folded layout does not fit once every optional column is gone, they are dropped unfolded.
        """
        for folding in (True, False):
            kept, rows = self._drop(width, folding)
            if self.wide or _needed(kept, rows) <= width:
                return kept, rows
        return None

    def _drop(self, width: int, folding: bool) -> tuple[list[Col], list[dict[str, Text]]]:
        kept = list(self.columns)
        rows = [{c.header: row.get(c.header, Text("")) for c in self.columns} for row in self.rows]
        while not self.wide and _needed(kept, rows) > width:
            optional = [c for c in kept if c.kind == "optional"]
            if not optional:
                break
            gone = min(optional, key=lambda c: c.drop)
            kept.remove(gone)
            if gone.into is None or not folding:
                continue
            for index, row in enumerate(rows):
                folds = self.folds[index] if index < len(self.folds) else {}
                piece = folds.get(gone.header, row[gone.header])
                if piece.plain:
                    target = row[gone.into]
                    joint = gone.sep if target.plain else ""
                    row[gone.into] = (
                        Text.assemble(piece, joint, target) if gone.before else Text.assemble(target, joint, piece)
                    )
        return kept, rows

    def table(self, kept: Sequence[Col], rows: Iterable[Mapping[str, Text]]) -> Table:
        """The rich table of ``kept`` columns (no vertical borders, a rule under the header)."""
        table = Table(
            title=self.title,
            title_justify="left",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            padding=(0, 1, 0, 0),
        )
        for col in kept:
            wraps = col.kind == "wrap" and not self.wide
            table.add_column(
                col.header,
                justify=col.justify,
                no_wrap=not wraps,
                overflow="fold" if wraps else "ellipsis",
                min_width=_minimum(col, rows) if wraps else None,
            )
        for index, row in enumerate(rows):
            table.add_row(*(row[col.header] for col in kept), style=self.styles[index] if self.styles else None)
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.wide:
            kept, rows = self.layout(options.max_width) or ([], [])
            table = self.table(kept, rows)
            natural = _needed(kept, rows, natural=True)
            yield from console.render(table, options.update_width(max(natural, options.max_width)))
            return
        fitted = self.layout(options.max_width)
        if fitted is None:
            yield from self._records()
            return
        yield self.table(*fitted)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        rows = [{c.header: row.get(c.header, Text("")) for c in self.columns} for row in self.rows]
        return Measurement(1, _needed(list(self.columns), rows, natural=True))

    def _records(self) -> Iterable[Text]:
        """Each row as ``header: value`` lines, a blank line between rows (narrower than any table)."""
        if self.title:
            yield Text(self.title)
        for index, row in enumerate(self.rows):
            if index:
                yield Text("")
            for col in self.columns:
                cell = row.get(col.header, Text(""))
                if cell.plain:
                    yield Text.assemble(f"{col.header}: ", cell)


def _natural(header: str, cells: Iterable[Text]) -> int:
    """The widest line of the header and the cells (in terminal cells)."""
    lines = [header, *(line for cell in cells for line in cell.plain.split("\n"))]
    return max(Text(line).cell_len for line in lines)


def _minimum(col: Col, rows: Iterable[Mapping[str, Text]]) -> int:
    """A wrap column's least width: its minimum or longest word (to `LONGEST_WORD`), never more than it needs."""
    cells = [row[col.header] for row in rows]
    words = [len(word) for cell in cells for word in cell.plain.split()]
    return min(_natural(col.header, cells), max(col.minimum, min(max(words, default=0), LONGEST_WORD)))


def _needed(kept: Sequence[Col], rows: Sequence[Mapping[str, Text]], *, natural: bool = False) -> int:
    """Width of a table of ``kept`` columns: whole and optional columns at their natural width, wrap columns at
    their minimum (or natural too), and a `GUTTER` between each two."""
    widths = [
        _minimum(col, rows)
        if col.kind == "wrap" and not natural
        else _natural(col.header, (row[col.header] for row in rows))
        for col in kept
    ]
    return sum(widths) + GUTTER * max(0, len(kept) - 1)
