"""The store tests' backend parameter: each such test runs on an HDF5 and on a Zarr store."""

from __future__ import annotations

import pytest

from ..helpers.store_rows import SUFFIXES


@pytest.fixture(params=SUFFIXES, ids=["hdf5", "zarr"])
def suffix(request) -> str:
    return request.param
