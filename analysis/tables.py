"""Fit tables as data, and their one renderer: terminal text, Markdown and HTML.

A *fit table* is an ``xr.Dataset`` that says how it is shown:

* its **rows** are the cells of its dims (in the order its data variables name them), each
  labelled by its coordinate values (a coordinate's ``format`` attr formats its labels);
* each **data variable** is a column: ``long_name`` is its header, ``units`` (optional) follow it
  in parentheses, ``format`` says how a value is shown (a format spec such as ``".3f"``, or a
  template such as ``"1e{:.1f}"``), ``missing`` what a NaN shows (default ``"n/a"``); booleans
  show ``yes`` / ``no``, strings as they are;
* ``attrs["column_dim"]`` (optional) names a dim spread into one column per coordinate value, for
  every variable that has it: the columns are headed by the values, under the variable's header;
* ``attrs["title"]`` is the line above the table, ``attrs["notes"]`` the lines below it.

A 0-d table is one row; a table without data variables is its title and notes alone (what is
shown where a fit cannot be done, with the reason). An analysis module's ``fit_tables(ds)``
returns ``{name: table}``; :func:`to_text`, :func:`to_markdown` and :func:`to_html` render such a
dict, one table, or (from an analysis module that has no tables as data) a plain text.
"""
from __future__ import annotations

import html
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import xarray as xr

__all__ = ["column", "make_table", "to_html", "to_markdown", "to_text"]


def column(da, long_name: str, fmt: str, *, units: str | None = None,
           missing: str | None = None) -> xr.DataArray:
    """``da`` (a DataArray or a scalar; a shallow copy) as a table column: headed ``long_name``, its
    values shown with ``fmt`` (a format spec or a ``{}`` template), NaN shown as ``missing``
    (default ``"n/a"``); of its own attrs only ``description`` is kept."""
    da = da.copy(deep=False) if isinstance(da, xr.DataArray) else xr.DataArray(da)
    kept = {"description": da.attrs["description"]} if "description" in da.attrs else {}
    da.attrs = {**kept, "long_name": long_name, "format": fmt, **({"units": units} if units is not None else {}),
                **({"missing": missing} if missing is not None else {})}
    return da


def make_table(columns: Mapping[str, xr.DataArray], *, title: str, notes: str = "", column_dim: str | None = None,
               formats: Mapping[str, str] | None = None) -> xr.Dataset:
    """A fit table: the ``columns`` (built by :func:`column`) as data variables over their own dims,
    without other coordinates than those dims (no columns: the title and notes alone); ``formats``
    gives the format of a row coordinate's labels (``{"U_norm": ".2f"}``), ``title``, ``notes`` and
    ``column_dim`` go to the attrs."""
    table = xr.Dataset({name: da.reset_coords(drop=True) for name, da in columns.items()})
    for dim, fmt in (formats or {}).items():
        table = table.assign_coords({dim: table[dim].copy().assign_attrs(format=fmt)})
    table.attrs = {"title": title, **({"notes": notes} if notes else {}),
                   **({"column_dim": column_dim} if column_dim else {})}
    return table


# ------------------------------------------------------------------------------------ cells


def _show(value, attrs: Mapping) -> str:
    """One value as shown: ``attrs['format']`` (spec or ``{}`` template; ``g`` for a float without
    one), ``attrs['missing']`` for NaN, ``yes`` / ``no`` for a boolean."""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    if value is None or (isinstance(value, (float, np.floating)) and math.isnan(value)):
        return str(attrs.get("missing", "n/a"))
    fmt = str(attrs.get("format", ""))
    if "{" in fmt:
        return fmt.format(value)
    if fmt.endswith("d") and isinstance(value, (float, np.floating)) and float(value).is_integer():
        value = int(value)
    if not fmt and isinstance(value, (float, np.floating)):
        fmt = "g"
    return format(value, fmt)


def _header(da: xr.DataArray) -> str:
    """``long_name (units)`` of a column (its name when it has no long_name)."""
    name = str(da.attrs.get("long_name", da.name))
    units = da.attrs.get("units")
    return f"{name} ({units})" if units else name


def _is_text(values: np.ndarray) -> bool:
    """Whether a column holds text (left-aligned) rather than numbers."""
    return values.dtype.kind in "US" or (values.dtype.kind == "O" and values.size > 0
                                        and isinstance(values.flat[0], str))


@dataclass(frozen=True)
class _Grid:
    """A table laid out as strings: the label columns (row coordinates), then the value columns."""

    title: str
    notes: list
    heads: list        # every column's header (labels first)
    groups: list       # per column: (key, header) of its spread variable, or None
    left: list         # per column: left-aligned (text) or not (numbers)
    rows: list         # per row: the cells of every column


def _row_dims(table: xr.Dataset) -> list:
    spread = table.attrs.get("column_dim")
    dims = []
    for var in table.data_vars.values():
        dims += [d for d in var.dims if d != spread and d not in dims]
    return dims


def _values(da: xr.DataArray, row_dims: list, sizes: Mapping) -> np.ndarray:
    """The values of ``da`` over the rows (broadcast over the row dims it lacks), flattened in row order."""
    missing = {d: sizes[d] for d in row_dims if d not in da.dims}
    return da.expand_dims(missing).transpose(*row_dims).values.ravel() if row_dims else np.atleast_1d(da.values)


def _grid(table: xr.Dataset) -> _Grid:
    row_dims = _row_dims(table)
    spread = table.attrs.get("column_dim")
    sizes = {d: table.sizes[d] for d in row_dims}
    n_rows = int(np.prod([sizes[d] for d in row_dims], dtype=np.int64))
    heads, groups, left, cols = [], [], [], []
    for d in row_dims:    # label columns: the coordinate value of each row
        coord = table[d]
        labels = np.broadcast_to(coord.values.reshape([-1 if e == d else 1 for e in row_dims]),
                                 [sizes[e] for e in row_dims]).ravel()
        heads.append(d)
        groups.append(None)
        left.append(_is_text(coord.values))
        cols.append([_show(v, coord.attrs) for v in labels])
    for name, var in table.data_vars.items():
        parts = [(var.isel({spread: i}), _show(v, table[spread].attrs)) for i, v in enumerate(table[spread].values)] \
            if spread and spread in var.dims else [(var, None)]
        for da, value_head in parts:
            values = _values(da, row_dims, sizes)
            heads.append(_header(var) if value_head is None else value_head)
            groups.append(None if value_head is None else (name, _header(var)))
            left.append(_is_text(values))
            cols.append([_show(v, var.attrs) for v in values])
    rows = [[c[i] for c in cols] for i in range(n_rows)] if table.data_vars else []
    notes = [line for line in str(table.attrs.get("notes", "")).split("\n") if line]
    return _Grid(str(table.attrs.get("title", "")), notes, heads, groups, left, rows)


def _tables(tables) -> list:
    if isinstance(tables, xr.Dataset):
        return [tables]
    return list(tables.values())


# ------------------------------------------------------------------------------------ text


def _group_line(grid: _Grid, widths: list) -> str:
    """The line above the headers naming each spread variable over its columns (``""`` if none)."""
    if all(g is None for g in grid.groups):
        return ""
    out, i = [], 0
    while i < len(widths):
        g = grid.groups[i]
        j = i + 1
        while g is not None and j < len(widths) and grid.groups[j] == g:
            j += 1
        span = sum(widths[i:j]) + 2 * (j - i - 1)
        out.append((g[1] if g is not None else "").ljust(span))
        i = j
    return "  ".join(out).rstrip()


def _widen_groups(grid: _Grid, widths: list) -> list:
    """Widths widened so that each spread variable's header fits over its columns."""
    widths = list(widths)
    i = 0
    while i < len(widths):
        g = grid.groups[i]
        j = i + 1
        while g is not None and j < len(widths) and grid.groups[j] == g:
            j += 1
        short = 0 if g is None else len(g[1]) - (sum(widths[i:j]) + 2 * (j - i - 1))
        for k in range(max(short, 0)):      # spread evenly over the group's columns
            widths[j - 1 - k % (j - i)] += 1
        i = j
    return widths


def _text_table(table: xr.Dataset) -> str:
    grid = _grid(table)
    lines = [grid.title] if grid.title else []
    if grid.rows:
        widths = [max([len(h)] + [len(r[i]) for r in grid.rows]) for i, h in enumerate(grid.heads)]
        widths = _widen_groups(grid, widths)

        def line(cells):
            return "  ".join(c.ljust(w) if lf else c.rjust(w) for c, w, lf in zip(cells, widths, grid.left)).rstrip()

        group = _group_line(grid, widths)
        lines += ([group] if group else []) + [line(grid.heads)] + [line(r) for r in grid.rows]
    return "\n".join(lines + grid.notes)


def to_text(tables) -> str:
    """Terminal text of fit tables (a ``{name: table}`` dict, one table, or a text, returned as it
    is): each table its title, headers, aligned rows and notes; tables apart by a blank line."""
    if isinstance(tables, str):
        return tables
    return "\n\n".join(_text_table(t) for t in _tables(tables))


# ------------------------------------------------------------------------------------ Markdown


def _md_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|")


def _md_table(table: xr.Dataset) -> str:
    grid = _grid(table)
    parts = [grid.title] if grid.title else []
    if grid.rows:
        heads = [h if g is None else f"{g[1]} {h}" for h, g in zip(grid.heads, grid.groups)]
        lines = ["| " + " | ".join(_md_cell(h) for h in heads) + " |",
                 "|" + "|".join("---" if lf else "---:" for lf in grid.left) + "|"]
        lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in grid.rows]
        parts.append("\n".join(lines))
    parts += grid.notes
    return "\n\n".join(parts)


def to_markdown(tables) -> str:
    """GitHub-flavoured Markdown of fit tables (as :func:`to_text`; a text becomes a code block):
    the title as a paragraph, a pipe table (``|`` escaped, numbers right-aligned), the notes."""
    if isinstance(tables, str):
        return f"```\n{tables}\n```"
    return "\n\n".join(_md_table(t) for t in _tables(tables))


# ------------------------------------------------------------------------------------ HTML


def _html_head(grid: _Grid) -> str:
    esc = html.escape
    if all(g is None for g in grid.groups):
        return "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in grid.heads) + "</tr>"
    top, below, i = [], [], 0
    while i < len(grid.heads):
        g = grid.groups[i]
        if g is None:
            top.append(f"<th rowspan='2'>{esc(grid.heads[i])}</th>")
            i += 1
            continue
        j = i
        while j < len(grid.heads) and grid.groups[j] == g:
            below.append(f"<th>{esc(grid.heads[j])}</th>")
            j += 1
        top.append(f"<th colspan='{j - i}'>{esc(g[1])}</th>")
        i = j
    return f"<tr>{''.join(top)}</tr><tr>{''.join(below)}</tr>"


def _html_table(table: xr.Dataset) -> str:
    grid = _grid(table)
    esc = html.escape
    parts = [f"<p class='fit-title'>{esc(grid.title)}</p>"] if grid.title else []
    if grid.rows:
        body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" if lf else f"<td class='num'>{esc(c)}</td>"
                                        for c, lf in zip(r, grid.left)) + "</tr>" for r in grid.rows)
        parts.append(f"<div class='fit-scroll'><table class='fit'><thead>{_html_head(grid)}</thead>"
                     f"<tbody>{body}</tbody></table></div>")
    if grid.notes:
        parts.append("<p class='fit-notes'>" + "<br>".join(esc(n) for n in grid.notes) + "</p>")
    return "<div class='fit-table'>" + "".join(parts) + "</div>"


def to_html(tables) -> str:
    """HTML of fit tables (as :func:`to_text`; a text becomes a ``<pre>`` block): per table a
    ``<div class='fit-table'>`` holding its title, a ``<table class='fit'>`` inside a
    ``<div class='fit-scroll'>`` (the page's CSS makes a wide table scroll within it), and its
    notes; every string escaped."""
    if isinstance(tables, str):
        return f"<pre>{html.escape(tables)}</pre>"
    return "\n".join(_html_table(t) for t in _tables(tables))
