"""Parquet segments: where a log's records go once it is closed, and how every record is read as a table.

A roll writes a closed log's records into `records/seg-NNNNNN.parquet` a few row groups at a time (fsynced, renamed
into place); a read by id decodes the one row group that holds it. `scan_records(data_dir)` gives a polars
LazyFrame over segments plus logs and is safe to call from another process while a server writes.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Callable, Iterable

import polars as pl

from reef_lab.records.logfile import Key, _batched, _fsync_dir, _known_key, _list_files, log_lines
from reef_lab.records.record import PARQUET_SCHEMA, frame_row_to_dict

SEGMENT_ROW_GROUP = 1024  # rows per Parquet row group: a read by id decodes one group, a scan hardly notices
ROLL_BATCH = 4096  # records parsed at once by a roll: fewer, larger parses cost less than groups of 1,024


def lines_to_frame(lines: list[bytes]) -> pl.DataFrame:
    """Records' row texts (row_text) in the Parquet layout, parsed by polars' JSON reader in Rust, off the GIL:
    rolling a 20,000-record log holds the GIL for milliseconds, not the ~0.3 s of building the frame in Python.
    (JSON-valued fields are text in the log because polars, asked to read a nested value as text, does not always
    write back the same JSON: a backslash or tab in a string comes out unescaped, 1.5e300 as an integer.)"""
    if not lines:
        return pl.DataFrame(schema=PARQUET_SCHEMA)
    return pl.read_ndjson(io.BytesIO(b"\n".join(lines)), schema=PARQUET_SCHEMA)



def scan_segments(paths: list[Path], tail: pl.DataFrame | list[pl.DataFrame] | None = None) -> pl.LazyFrame:
    """Segments (and in-memory tail frames) as one LazyFrame. Segments written by an older schema version lack
    newer columns; they read as nulls there, so old data dirs stay readable."""
    parts = [_conform(pl.scan_parquet(str(p))) for p in paths]
    tails = [] if tail is None else tail if isinstance(tail, list) else [tail]
    parts += [t.lazy() for t in tails]
    if not parts:
        return pl.DataFrame(schema=PARQUET_SCHEMA).lazy()
    return pl.concat(parts, how="vertical_relaxed")


def _conform(lf: pl.LazyFrame) -> pl.LazyFrame:
    names = set(lf.collect_schema().names())
    missing = [pl.lit(None, dtype).alias(k) for k, dtype in PARQUET_SCHEMA.items() if k not in names]
    return (lf.with_columns(missing) if missing else lf).select(list(PARQUET_SCHEMA))


def scan_records(data_dir: str | Path) -> pl.LazyFrame:
    """A LazyFrame over every record in a data dir (Parquet segments and not-yet-rolled logs).

    Safe while a server writes: logs are read before segments are listed, and a log whose segment exists is
    skipped, so a roll that happens in between neither hides nor doubles a record.
    """
    folder = Path(data_dir) / "records"
    logs, _ = _list_files(folder)
    log_texts = {}
    for no, path in sorted(logs.items()):
        try:
            log_texts[no] = log_lines(path)[0]
        except FileNotFoundError:  # rolled away meanwhile: its segment is listed below
            continue
    _, segs = _list_files(folder)
    tail = [line for no, lines in sorted(log_texts.items()) if no not in segs for line in lines]
    return scan_segments([segs[no] for no in sorted(segs)], lines_to_frame(tail) if tail else None)


def collect_records(data_dir: str | Path, query: Callable[[pl.LazyFrame], pl.LazyFrame],
                    tries: int = 5) -> pl.DataFrame:
    """`query(scan_records(data_dir)).collect()`, listed and read again if a retention round deleted a segment in
    between (the server's retention runs in another process): one consistent view of what is kept."""
    for attempt in range(tries):
        try:
            return query(scan_records(data_dir)).collect()
        except FileNotFoundError:
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def read_rows(path: Path, rows: list[tuple[int, str]]) -> dict[str, dict]:
    """Records at the given rows of one segment: each run of nearby rows is one slice, which decodes only the row
    groups it touches."""
    rows = sorted(rows)
    lf = scan_segments([path])
    out, i = {}, 0
    while i < len(rows):
        j = i
        while j + 1 < len(rows) and rows[j + 1][0] - rows[i][0] < SEGMENT_ROW_GROUP:
            j += 1
        start = rows[i][0]
        df = lf.slice(start, rows[j][0] - start + 1).collect()
        for row, rid in rows[i:j + 1]:
            d = frame_row_to_dict(df.row(row - start, named=True))
            if d["id"] != rid:
                raise RuntimeError(f"segment {path.name} row {row} holds {d['id']!r}, its index says {rid!r}")
            out[rid] = d
        i = j + 1
    return out


def write_segment(folder: Path, no: int, rows: Iterable[bytes], known: dict | None = None) -> list[Key]:
    """Write segment `no` a few row groups at a time (ROLL_BATCH records parsed at once, SEGMENT_ROW_GROUP to a
    group), so a roll's memory stays that of one batch (building a whole log's frame at once left the process
    larger for good); returns the records' index keys in row order, from `known` (id -> index entry) where it
    holds them. A read by id decodes one group, not the segment."""
    import pyarrow.parquet as pq  # polars writes no Parquet file a group at a time; pyarrow does

    path = folder / f"seg-{no:06d}.parquet"
    tmp = path.with_suffix(".parquet.tmp")
    keys: list[Key] = []
    writer = None
    try:
        for group in _batched(rows, ROLL_BATCH):
            keys += [_known_key(line, known) for line in group]
            table = lines_to_frame(group).to_arrow()
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema, compression="zstd", write_statistics=True)
            writer.write_table(table, row_group_size=SEGMENT_ROW_GROUP)
        if writer is None:  # an empty log: an empty segment, so the log's number is taken
            lines_to_frame([]).write_parquet(tmp)
    finally:
        if writer is not None:
            writer.close()
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(folder)
    return keys


def segment_ids(path: Path) -> list[tuple[str, str]]:
    """(id, scenario) of each row of a segment, in row order (two columns read, nothing else)."""
    df = pl.read_parquet(path, columns=["id", "scenario"])
    return list(zip(df["id"].to_list(), df["scenario"].to_list(), strict=True))


def rewrite_segment(path: Path, drop: set[str]) -> tuple[Path, list[tuple[str, str, float]]]:
    """Segment `path` without the records `drop`, written to `<path>.tmp` (fsynced; the caller puts it in place)
    one row group at a time in the file's own schema; returns that path and (id, scenario, write time) of each
    row it holds, in row order."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    tmp = path.with_suffix(".parquet.tmp")
    src = pq.ParquetFile(path)
    gone = pa.array(sorted(drop), pa.string())
    time_cols = [c for c in ("stored_at", "created_at") if c in src.schema_arrow.names]
    kept: list[tuple[str, str, float]] = []
    pending: list = []
    writer = pq.ParquetWriter(tmp, src.schema_arrow, compression="zstd", write_statistics=True)

    def flush(final: bool) -> None:
        n = sum(t.num_rows for t in pending)
        take = n if final else n - n % SEGMENT_ROW_GROUP  # whole row groups, but for the last
        if not take:
            return
        table = pa.concat_tables(pending)
        writer.write_table(table.slice(0, take), row_group_size=SEGMENT_ROW_GROUP)
        pending[:] = [table.slice(take)] if take < n else []
    try:
        for i in range(src.num_row_groups):
            t = src.read_row_group(i)
            t = t.filter(pc.invert(pc.is_in(t["id"], value_set=gone)))
            if not t.num_rows:
                continue
            at = pc.coalesce(*[t[c] for c in time_cols]) if time_cols else pa.nulls(t.num_rows, pa.float64())
            kept += zip(t["id"].to_pylist(), t["scenario"].to_pylist(),
                        [x if x is not None else 0.0 for x in at.to_pylist()], strict=True)
            pending.append(t)
            if sum(p.num_rows for p in pending) >= ROLL_BATCH:
                flush(False)
        flush(True)
    finally:
        writer.close()
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    return tmp, kept
