"""A list's missing file on a local Ray cluster: its error row names the list's line, as on
one board (tests/test_data_sources_lines.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from runs import config, fast_sim

pytest.importorskip("ray")
pytestmark = pytest.mark.ray

from test_cluster import cluster, no_leaks  # noqa: E402, F401 - the module's cluster and guard
from test_data_sources_lines import _errors, _list_with_a_missing_file  # noqa: E402

from batchinfer.cluster import run_on_cluster  # noqa: E402


def test_a_missing_file_of_a_list_on_a_cluster_names_its_line(
    cluster,  # noqa: F811
    demo_kit,
    tmp_path: Path,
) -> None:
    lst = _list_with_a_missing_file(demo_kit.dataset, tmp_path)
    cfg = config(lst, demo_kit.models["digits"], backend="sim", sim=fast_sim(), out=tmp_path / "c")
    result = run_on_cluster(cfg, cluster.address, data="shared")
    assert (result.succeeded, result.errors) == (3, 2)
    errors = _errors(result.out)
    assert errors["gone"].startswith(f"line 3 of {lst}: ") and "No such file" in errors["gone"]
    assert errors["empty"].startswith(f"line 4 of {lst}: ")
