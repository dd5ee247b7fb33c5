"""``ProcMesh.to_table()``: a mesh's cells drawn as Monarch draws them (``tabulate``'s "grid").

One dimension is one table under the dimension's name; two are rows and columns, the row
dimension's name to the left of the middle row; a third draws one such table per index of the
first dimension, each under ``<name>: <index>``.
"""

from __future__ import annotations

from collections.abc import Sequence


def grid(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``rows`` under ``headers`` in boxes, every cell right-aligned (a column is at least two
    wider than its header, as tabulate makes it)."""
    widths = [max(len(headers[c]) + 2, *(len(row[c]) for row in rows)) for c in range(len(headers))]

    def rule(fill: str) -> str:
        return "+" + "+".join(fill * (w + 2) for w in widths) + "+"

    def line(cells: Sequence[str]) -> str:
        return "|" + "|".join(f" {cell:>{w}} " for cell, w in zip(cells, widths, strict=True)) + "|"

    out = [rule("-"), line(headers), rule("=")]
    for row in rows:
        out += [line(row), rule("-")]
    return "\n".join(out)


def _plane(
    names: Sequence[str], cells: Sequence[Sequence[str]], with_column_name: bool
) -> list[str]:
    """One 2-D table (``names``: the row and column dimensions' names) as lines."""
    row_name, column_name = names
    headers = ["", *(str(c) for c in range(len(cells[0])))]
    lines = grid(headers, [[str(r), *row] for r, row in enumerate(cells)]).split("\n")
    row_label_width = len(str(len(cells) - 1)) + 4
    if with_column_name:
        data_width = len(lines[0]) - row_label_width
        lines.insert(0, f"{' ' * row_label_width}{column_name:^{data_width}}")
    body = lines[1:] if with_column_name else lines
    middle = len(body) // 2
    labelled = [
        f"{row_name if i == middle else ' ' * len(row_name)} │{text}" for i, text in enumerate(body)
    ]
    if with_column_name:
        labelled.insert(0, f"{' ' * (len(row_name) + 2)}{lines[0]}")
    return labelled


def mesh_table(names: Sequence[str], sizes: Sequence[int], cells: Sequence[str]) -> str:
    """The table of a mesh of 1 to 3 dimensions whose cells, in rank order, are ``cells``."""
    if not 1 <= len(sizes) <= 3:
        raise ValueError(f"to_table draws meshes of 1 to 3 dimensions, not {len(sizes)}")
    if len(sizes) == 1:
        lines = grid([str(c) for c in range(sizes[0])], [list(cells)]).split("\n")
        return "\n".join([f"{names[0]:^{len(lines[0])}}", *lines])
    rows, columns = sizes[-2], sizes[-1]
    planes = []
    for depth in range(sizes[0] if len(sizes) == 3 else 1):
        start = depth * rows * columns
        plane = [list(cells[start + r * columns : start + (r + 1) * columns]) for r in range(rows)]
        lines = _plane(names[-2:], plane, with_column_name=depth == 0)
        header = f"{names[0]}: {depth}\n" if len(sizes) == 3 else ""
        planes.append(("\n" if depth else "") + header + "\n".join(lines))
    return "\n".join(planes)
