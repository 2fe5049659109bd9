"""Writing WebDataset-style tar shards from a dataset folder, for tests."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from batchinfer.data.folder import open_dataset


def write_shards(folder: Path, out: Path, count: int, *, labels: bool = True) -> list[Path]:
    """Write the items of the dataset ``folder`` into ``count`` shards ``out/part-NNN.tar``
    in the folder's order (consecutive runs of items), each image member ``rel`` beside a
    ``.cls`` member holding its class folder's label when ``labels``. Returns the shards."""
    dataset = open_dataset(folder)
    items = list(dataset)
    out.mkdir(parents=True, exist_ok=True)
    per = -(-len(items) // count)
    shards = []
    for n in range(count):
        path = out / f"part-{n:03d}.tar"
        with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
            for item in items[n * per : (n + 1) * per]:
                tar.add(item.path, arcname=item.id)
                if labels and item.label is not None:
                    add_bytes(tar, item.id.rsplit(".", 1)[0] + ".cls", b"%d" % item.label)
        shards.append(path)
    return shards


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """Add a member ``name`` holding ``data``."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
