"""Tables for the listing commands: rich tables on a terminal, whose identifier columns (task ids, entry names, paths:
what a user copies into the next command) are never cut or wrapped, and plain tab-separated lines when the output is
piped or redirected, so that ``grep`` and ``cut`` see whole values."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table


def print_table(console: Console, title: str, columns: Sequence[str], rows: Sequence[Sequence[str]],
                identifiers: Sequence[int] = (0,)) -> None:
    """``identifiers``: the indices of the columns whose values must stay whole."""
    if not console.is_terminal:
        console.file.write(f"# {title}\n" + "\t".join(columns) + "\n")
        for row in rows:
            console.file.write("\t".join(str(v).replace("\t", " ").replace("\n", " ") for v in row) + "\n")
        console.file.flush()
        return
    table = Table(title=title)
    for i, name in enumerate(columns):
        if i in identifiers:
            width = max([len(name), *(len(str(row[i])) for row in rows)])
            table.add_column(name, no_wrap=True, min_width=width, overflow="ignore")
        else:
            table.add_column(name, overflow="fold")  # wrapped, never cut
    for row in rows:
        table.add_row(*(str(v) for v in row))
    console.print(table)
