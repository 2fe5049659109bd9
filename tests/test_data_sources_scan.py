"""A Parquet list's column-wise scan (batchinfer.data.manifest.ParquetList.scan): ids are
checked unique across its batches, whether every row has an id or some fall back to
their paths."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchinfer.data.dataset import Dataset
from batchinfer.data.listed import open_listed
from batchinfer.data.manifest import ParquetList
from batchinfer.errors import DatasetError


def _parquet(tmp_path, ids) -> Dataset:
    """A Parquet list of ``ids``, opened to be scanned two rows at a time."""
    path = tmp_path / "m.parquet"
    paths = [f"{n}.png" for n in range(len(ids))]
    pq.write_table(pa.table({"path": paths, "id": ids}), path)
    return open_listed(ParquetList(path, scan_rows=2))


@pytest.mark.parametrize(
    ("ids", "needle"),
    [
        (["a", "b", "c", "a", "d"], "'a' (row 1 and row 4)"),
        ([1, 2, 3, 4, 2], "'2' (row 2 and row 5)"),
        (["a", None, "b", "1.png"], "'1.png' (row 2 and row 4)"),  # an id that is a path
    ],
)
def test_a_parquet_lists_repeated_ids_are_found_across_batches(tmp_path, ids, needle):
    with pytest.raises(DatasetError, match=re.escape(needle)):
        _parquet(tmp_path, ids)


@pytest.mark.parametrize("ids", [["a", "b", "c", "d", "e"], [5, 4, 3, 2, 1], ["a", None, "c"]])
def test_a_parquet_list_with_unique_ids_opens(tmp_path, ids):
    ds = _parquet(tmp_path, ids)
    assert [i.id for i in ds] == [str(i) if i is not None else f"{n}.png"
                                  for n, i in enumerate(ids)]  # fmt: skip
