"""``arrowread.TableReader.batches``: a Delta table's rows streamed file by file in
batches of the size asked, typed as the table's schema, holding a batch and not a
row group, whatever the row group's size."""

from __future__ import annotations

import datetime as dt
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from binlake.lake.store import arrowread

ROWS = 400_000


def _table(n: int, start: int = 0) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "c": pa.array([f"{i:060d}" for i in ids]),
                     "at": pa.array([dt.datetime(2026, 1, 1)] * n, pa.timestamp("us")),
                     "unused": pa.array([f"{i:040d}" for i in ids])})


def test_batches_stream_every_row_in_order_holding_one_batch_not_a_row_group(tmp_path: pathlib.Path) -> None:
    from deltalake import WriterProperties, write_deltalake

    path = str(tmp_path / "t")
    # Two files, each one row group of ROWS rows (decoded: about 45 MiB of the columns read).
    for start in (0, ROWS):
        write_deltalake(path, _table(ROWS, start), mode="append",
                        writer_properties=WriterProperties(max_row_group_size=ROWS))
    groups = [pq.ParquetFile(f).metadata.num_row_groups for f in pathlib.Path(path).glob("*.parquet")]
    assert groups == [1, 1]
    reader = arrowread.TableReader(path)
    before = pa.total_allocated_bytes()
    peak = 0
    sizes: list[int] = []
    total = 0
    for batch in reader.batches(["id", "c", "at"], 5_000):
        peak = max(peak, pa.total_allocated_bytes() - before)
        assert batch.schema.names == ["id", "c", "at"] and batch.schema.field("at").type == pa.timestamp("us")
        sizes.append(batch.num_rows)
        total += int(batch.column("id").to_numpy().sum())
    assert max(sizes) == 5_000 and sum(sizes) == 2 * ROWS
    assert total == sum(range(2 * ROWS))  # every row once (the ids are distinct)
    # A batch of 5,000 rows takes about 0.4 MiB; a row group's decoded columns ~45 MiB.
    assert peak < 8 << 20, peak


def test_batches_refuse_what_they_cannot_read_before_the_first_batch(tmp_path: pathlib.Path) -> None:
    from deltalake import write_deltalake

    path = str(tmp_path / "t")
    write_deltalake(path, _table(10))
    reader = arrowread.TableReader(path)
    with pytest.raises(arrowread.NotReadable, match="no column"):
        reader.batches(["id", "nope"], 10)
    with pytest.raises(ValueError, match="batch_rows"):
        reader.batches(["id"], 0)
    parted = str(tmp_path / "p")
    write_deltalake(parted, _table(10).append_column("day", pa.array(["a"] * 10)), partition_by=["day"])
    with pytest.raises(arrowread.NotReadable, match="partition"):
        arrowread.TableReader(parted).batches(["id"], 10)
    with pytest.raises(arrowread.NotReadable):
        arrowread.TableReader(str(tmp_path / "none"))
