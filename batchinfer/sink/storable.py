"""Turning a part's buffered rows into Arrow columns, where one bad value costs one row.

A value Arrow cannot hold (a label of 2**63 or more, an integer too large for a list
column's int64, a name with lone surrogates) must not stop the part: the run would stop
at it, and a ``--resume`` would meet it again at once, for ever. So each column is built
in one go (the fast path), and only when that fails is it built value by value: a text
value is escaped (nothing lost), any other value that cannot be stored is nulled and its
row becomes an error row that names the field and the value (:func:`as_error_rows`). The
row stays in its part, so every item still has exactly one row; being an error row,
``--resume`` runs the item again, and it ends the same way until the dataset is fixed.
"""

from __future__ import annotations

from collections.abc import Collection

import pyarrow as pa

from batchinfer.sink.atomic import DATA_ERRORS

#: Columns that hold an item's result: null on an error row.
RESULT_COLUMNS = ("pred", "topk_index", "topk_score", "boxes", "n_boxes", "width", "height")
_SHOWN = 40  # characters of a value shown in an error row


def safe_text(text: str) -> str:
    """``text`` as valid UTF-8: surrogates (bytes of a non-UTF-8 file name) as ``\\xNN``.

    Python keeps undecodable bytes of file names as lone surrogates, which Parquet cannot
    store; an error message or class name that quotes such a name goes through here.
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "surrogateescape") if _escapable(text) else None
        if raw is not None:
            return raw.decode("utf-8", "backslashreplace")
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _escapable(text: str) -> bool:
    try:
        text.encode("utf-8", "surrogateescape")
        return True
    except UnicodeEncodeError:
        return False


def text_array(values: list, value_type: pa.DataType) -> pa.Array:
    """A string or binary column; strings Arrow refuses (lone surrogates) are escaped."""
    try:
        return pa.array(values, type=value_type)
    except (UnicodeEncodeError, pa.ArrowException):
        if not pa.types.is_string(value_type):
            raise
        return pa.array([None if v is None else safe_text(v) for v in values], type=value_type)


def _shown(value: object) -> str:
    text = safe_text(repr(value))
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


def checked_array(
    values: list, name: str, value_type: pa.DataType, unstorable: dict[int, str]
) -> pa.Array:
    """Column ``name`` of ``values``; a value Arrow refuses is nulled, and why is put in
    ``unstorable`` under its row (the first reason a row has is kept)."""
    try:
        return pa.array(values, type=value_type)
    except DATA_ERRORS:
        pass
    fixed = list(values)
    for row, value in enumerate(values):
        if value is None:
            continue
        try:
            pa.array([value], type=value_type)
        except DATA_ERRORS as exc:
            fixed[row] = None
            unstorable.setdefault(
                row,
                f"its {name} {_shown(value)} cannot be stored in the predictions as "
                f"{value_type} ({type(exc).__name__}: {safe_text(str(exc))[:200]}); "
                "fix it where the dataset gives it",
            )
    return pa.array(fixed, type=value_type)


def meta_array(
    values: list, meta: pa.StructType, unstorable: dict[int, str] | None = None
) -> pa.Array:
    """The ``meta`` struct column (a list's other columns); a row whose values Arrow
    refuses gets a null meta, and becomes an error row that says so (``unstorable``)."""
    return checked_array(values, "meta", meta, {} if unstorable is None else unstorable)


def as_error_rows(
    table: pa.Table, unstorable: dict[int, str], results: Collection[str] = RESULT_COLUMNS
) -> pa.Table:
    """``table`` with the rows of ``unstorable`` made error rows: their ``results`` columns
    (the task's: a plug-in's own) and saved outputs null, their error the reason (a row that
    was an error row keeps its own)."""
    import pyarrow.compute as pc  # only here: importing it costs every run ~50 ms

    n = table.num_rows
    bad = [False] * n
    for row in unstorable:
        bad[row] = True
    mask = pa.array(bad)
    errors = table.column("error").to_pylist()
    for row, why in unstorable.items():
        if errors[row] is None:
            errors[row] = why
    columns = []
    for field, column in zip(table.schema, table.columns, strict=True):
        if field.name == "error":
            column = pa.chunked_array([pa.array(errors, type=field.type)])
        elif field.name in results or field.name.startswith("out_"):
            column = pc.if_else(mask, pa.scalar(None, type=field.type), column)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=table.schema)
