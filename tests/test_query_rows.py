"""Summary tables never cut rows silently (issue 31): every row up to the limit, then a count."""

from __future__ import annotations

import numpy as np
import xarray as xr

from storage.query import summary


def _grid(n: int) -> xr.Dataset:
    return xr.Dataset({"c_star": (("d",), np.arange(n, dtype=float)), "done": (("d",), np.ones(n, bool))},
                      coords={"d": np.arange(n)})


def test_fifty_rows_are_all_printed():
    text = summary(_grid(50))
    assert all(f"\n{i} " in text or text.startswith(f"{i} ") or f"\n{i:>2} " in text for i in range(50)), text
    assert "more rows" not in text


def test_past_the_limit_the_rest_is_counted():
    text = summary(_grid(80), max_rows=60)
    assert text.rstrip().endswith("`kktlab show STORE` prints them all") and "20 more rows (of 80)" in text
    assert "more rows" not in summary(_grid(80), max_rows=None)
