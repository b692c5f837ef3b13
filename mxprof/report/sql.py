"""SQL over traces: ``mxprof sql`` and ``mxprof.sql``, on DuckDB.

A query runs on an in-memory DuckDB whose views are the Parquet tables of
``trace.parquet`` (``slice``, ``counter``, ``instant``, ``thread``,
``process``) and three views a user would otherwise write:

- ``step_breakdown``: per step and rank, the time in each top-level range of
  the step (the ranges directly inside the step's range, on its thread):
  ``rank, role, host, step, step_ns, name, count, total_ns, share``;
- ``no_range``: per step and rank, the step's time in no range but the step
  (its length less what its direct children cover):
  ``rank, role, host, step, step_ns, in_ranges_ns, no_range_ns, share``;
- ``collective_waits``: per rank, its communication (``report/_collective``'s
  rule: torch collectives, kvstore operations, the ``comm`` and ``kvstore``
  domains) and, for collectives matched across ranks (the n-th call of a
  name is the same collective everywhere), the time it waited for the last
  rank to arrive: ``rank, role, host, calls, comm_ns, matched_calls, wait_ns``.

Inputs are traces or folders that ``mxprof export --format parquet`` wrote.
Traces are converted on first use and the tables cached beside the first
trace, in ``.mxprof-sql-<digest>/`` (the digest names the set of traces, in
order, so that they share one merged clock); a cache is used again while its
``manifest.json`` names each trace with the size and modification time it
has now, and was written by this schema version; otherwise it is converted
again.  Where the trace's folder cannot be written, the tables go to a
temporary folder, removed after the query.

Needs duckdb and pyarrow: ``pip install "mxprof[sql]"``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import OutputError, ProfilerError, TraceFormatError
from ..trace import parquet
from ..trace.reader import PathArg, shown
from ._collective import parse

CACHE_PREFIX = ".mxprof-sql-"
ALLOWED = ("SELECT", "EXPLAIN")  # statement types a query may be: it reads, never writes


class SqlError(ProfilerError, ValueError):
    """A query DuckDB refused (syntax, unknown table or column, a type), or one
    that is not a single SELECT; the message is DuckDB's."""


def sql(query: str, paths: PathArg | Sequence[PathArg], *, arrow: bool = False) -> Any:
    """Run one SQL query over traces; return its rows as dicts (or, with
    ``arrow=True``, a ``pyarrow.Table``).

    Args:
        query: one SELECT (or EXPLAIN) over the tables and views of the
            module's docstring.
        paths: traces (any form ``mxprof.load`` reads; several are placed on
            one clock as ``mxprof merge`` places them) and folders written by
            ``mxprof export --format parquet``.
        arrow: return a pyarrow Table instead of a list of dicts.

    Raises:
        SqlError: DuckDB refused the query (its message), or it is not one
            SELECT; nothing was converted or written.
        MissingExtra: duckdb or pyarrow is not installed.
        TraceReadError, TraceFormatError: an input cannot be read.

    Example:
        >>> rows = mxprof.sql("select name, count(*) n from slice group by name order by name",
        ...                   "trace.json")  # doctest: +SKIP
        >>> rows  # doctest: +SKIP
        [{'name': 'backward', 'n': 1000}, {'name': 'forward', 'n': 1000}]
    """
    table = run(query, [paths] if isinstance(paths, (str, os.PathLike)) else list(paths))
    return table if arrow else table.to_pylist()


def run(
    query: str, paths: Sequence[PathArg], *, jobs: int | None = 1, engine: str = "local"
) -> Any:
    """``sql``'s work: the query's result as a pyarrow Table (traces not yet
    converted are, on the executor jobs and engine name: ``write_parquet``)."""
    _, _, duckdb = parquet.need()
    if not paths:
        raise TraceFormatError("sql: no traces or Parquet folders given")
    con = duckdb.connect(":memory:")
    try:
        check(con, query)
        with _folders(paths, jobs, engine) as folders:
            _views(con, folders)
            try:
                relation = con.sql(query)
                # duckdb 2.x names it to_arrow_table, 1.x arrow
                table = (getattr(relation, "to_arrow_table", None) or relation.arrow)()
            except duckdb.Error as e:
                raise SqlError(str(e)) from None
            return _plain(table)
    finally:
        con.close()


def _plain(table: Any) -> Any:
    """Whole-number decimals (DuckDB's sums of BIGINT are HUGEINT) as int64 where
    they fit, so that rows hold ints and JSON writes numbers."""
    import pyarrow as pa  # type: ignore[import-untyped]

    for k, field in enumerate(table.schema):
        if pa.types.is_decimal(field.type) and field.type.scale == 0:
            try:
                column = table.column(k).cast(pa.int64())
            except pa.ArrowInvalid:  # past int64: kept as it is
                continue
            table = table.set_column(k, pa.field(field.name, pa.int64()), column)
    return table


def check(con: Any, query: str) -> None:
    """Refuse a query that does not parse, or is not exactly one SELECT/EXPLAIN."""
    import duckdb

    try:
        statements = con.extract_statements(query)
    except duckdb.Error as e:
        raise SqlError(str(e)) from None
    kinds = [s.type.name for s in statements]
    if len(kinds) != 1 or kinds[0] not in ALLOWED:
        raise SqlError(
            f"a query is one SELECT (or EXPLAIN) statement; got {', '.join(kinds) or 'none'}"
        )


def cache_folder(paths: Sequence[PathArg]) -> str:
    """Where the tables of these traces (in this order) are cached.

    Example:
        >>> cache_folder(["/data/run/rank0.json"]).startswith("/data/run/.mxprof-sql-")
        True
    """
    absolute = [os.path.abspath(os.fspath(p)) for p in paths]
    digest = hashlib.sha1("\0".join(absolute).encode("utf-8", "surrogateescape")).hexdigest()
    return os.path.join(os.path.dirname(absolute[0]), CACHE_PREFIX + digest[:16])


def fresh(folder: str, paths: Sequence[PathArg]) -> bool:
    """Whether folder holds the tables of these traces as they are now."""
    try:
        with open(os.path.join(folder, parquet.MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return False
    return (
        isinstance(manifest, dict)
        and manifest.get("schema") == parquet.SCHEMA_VERSION
        and manifest.get("sources") == parquet.sources(paths)
    )


@contextlib.contextmanager
def _folders(paths: Sequence[PathArg], jobs: int | None, engine: str) -> Iterator[list[str]]:
    """The Parquet folders of the inputs: given ones as they are, the traces
    converted together (or their cache reused)."""
    folders: list[str] = []
    traces: list[PathArg] = []
    for p in paths:
        name = os.fspath(p)
        if os.path.isdir(name):
            if not os.path.exists(os.path.join(name, parquet.MANIFEST)):
                raise TraceFormatError(
                    f"{shown(name)}: a folder, but not one of mxprof's Parquet tables "
                    "(no manifest.json; write one with mxprof export --format parquet)"
                )
            folders.append(name)
        else:
            traces.append(p)
    temporary = None
    try:
        if traces:
            cache = cache_folder(traces)
            if not fresh(cache, traces):
                try:
                    parquet.write_parquet(traces, cache, jobs=jobs, engine=engine)
                except OutputError:  # the traces' folder is not ours to write: a temporary one
                    temporary = tempfile.mkdtemp(prefix="mxprof-sql-")
                    cache = os.path.join(temporary, "tables")
                    parquet.write_parquet(traces, cache, jobs=jobs, engine=engine)
            folders.append(cache)
        yield folders
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def _views(con: Any, folders: list[str]) -> None:
    """The tables as views over the folders' files, and the built-in views."""

    def files(table: str) -> str:
        if table in parquet.PARTITIONED:
            found = [os.path.join(f, table, "**", "*.parquet") for f in folders]
        else:
            found = [os.path.join(f, f"{table}.parquet") for f in folders]
        return "[" + ", ".join("'" + parquet.quoted(f) + "'" for f in found) + "]"

    for table in parquet.TABLES:
        hive = ", hive_partitioning = true" if table in parquet.PARTITIONED else ""
        con.execute(
            f"CREATE VIEW {table} AS SELECT * FROM read_parquet({files(table)}"
            f"{hive}, union_by_name = true)"
        )
    con.create_function(
        "mxprof_communication",
        _communication,
        ["VARCHAR", "VARCHAR"],
        "VARCHAR",
        null_handling="special",
    )
    for statement in _BUILT_IN:
        con.execute(statement)


def _communication(name: str | None, category: str | None) -> str | None:
    """'matched' (a collective, matched across ranks), 'unmatched' (other
    communication) or None (not communication), by ``_collective.parse``."""
    found = parse(name or "", category or "")
    if found is None:
        return None
    return "unmatched" if found.p2p else "matched"


_BUILT_IN = (
    """
CREATE VIEW step_breakdown AS
WITH steps AS (SELECT utid, step_number AS step, ts, dur, depth FROM slice
               WHERE step_number IS NOT NULL)
SELECT s.rank, s.role, s.host, st.step, st.dur AS step_ns, s.name, count(*) AS count,
       sum(s.dur) AS total_ns, sum(s.dur) / nullif(st.dur, 0) AS share
FROM slice s JOIN steps st
  ON s.utid = st.utid AND s.step = st.step AND s.depth = st.depth + 1
 AND s.ts >= st.ts AND s.ts <= st.ts + st.dur
GROUP BY s.rank, s.role, s.host, st.step, st.dur, s.name
""",
    """
CREATE VIEW no_range AS
WITH steps AS (SELECT rank, role, host, utid, step_number AS step, ts, dur, depth FROM slice
               WHERE step_number IS NOT NULL),
inside AS (
    SELECT st.rank, st.role, st.host, st.utid, st.step, st.ts, st.dur,
           sum(greatest(least(s.ts + s.dur, st.ts + st.dur) - greatest(s.ts, st.ts), 0))
               AS in_ranges_ns
    FROM steps st LEFT JOIN slice s
      ON s.utid = st.utid AND s.step = st.step AND s.depth = st.depth + 1
     AND s.ts >= st.ts AND s.ts <= st.ts + st.dur
    GROUP BY ALL
)
SELECT rank, role, host, step, dur AS step_ns, coalesce(in_ranges_ns, 0) AS in_ranges_ns,
       dur - coalesce(in_ranges_ns, 0) AS no_range_ns,
       (dur - coalesce(in_ranges_ns, 0)) / nullif(dur, 0) AS share
FROM inside
""",
    """
CREATE VIEW collective_waits AS
WITH kinds AS (SELECT DISTINCT name, category FROM slice),
comm AS (SELECT name, category, mxprof_communication(name, category) AS how FROM kinds),
calls AS (
    SELECT s.rank, s.role, s.host, s.upid, s.name, s.ts, s.dur, c.how,
           row_number() OVER (PARTITION BY s.upid, s.name ORDER BY s.ts) AS n
    FROM slice s JOIN comm c ON s.name = c.name AND s.category = c.category
    WHERE c.how IS NOT NULL
),
waits AS (
    SELECT *, CASE WHEN how = 'matched'
                   THEN least(greatest(max(ts) OVER (PARTITION BY name, n) - ts, 0), dur)
              END AS wait
    FROM calls
)
SELECT rank, role, host, count(*) AS calls, sum(dur) AS comm_ns,
       count(wait) AS matched_calls, coalesce(sum(wait), 0) AS wait_ns
FROM waits GROUP BY rank, role, host
""",
)


def write(table: Any, format: str, out: Any) -> None:
    """A result to out (a text file) as ``table`` (aligned columns), ``csv`` or ``json``
    (one array of objects)."""
    rows = table.to_pylist()
    names = table.column_names
    if format == "json":
        json.dump(rows, out, default=str)
        out.write("\n")
    elif format == "csv":
        import csv

        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        writer.writerows([[_cell(r[n], "") for n in names] for r in rows])
    else:
        cells = [[_cell(r[n], "NULL") for n in names] for r in rows]
        widths = [max([len(n)] + [len(c[k]) for c in cells]) for k, n in enumerate(names)]
        out.write("  ".join(n.ljust(w) for n, w in zip(names, widths)).rstrip() + "\n")
        out.write("  ".join("-" * w for w in widths) + "\n")
        for c in cells:
            out.write("  ".join(v.rjust(w) if _numeric(v) else v.ljust(w)
                                for v, w in zip(c, widths)).rstrip() + "\n")  # fmt: skip
        out.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n")


def _cell(value: Any, null: str) -> str:
    if value is None:
        return null
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
