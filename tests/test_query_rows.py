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


def test_one_long_axis_past_the_limit_is_averaged_and_says_so():
    """Issue 33 item 5: a 1-D grid of 80 cells over a 60-row limit ends in one row of means over it
    (n_used 80), with the way to list every cell; ``max_rows=None`` (show --all) lists all 80."""
    text = summary(_grid(80), max_rows=60)
    rows = [ln.split() for ln in text.splitlines() if ln.startswith("mean")]
    assert len(rows) == 1 and float(rows[0][-1]) == 80, text
    assert float(rows[0][1]) == np.arange(80.0).mean(), text
    assert "means over d" in text and "kktlab show STORE --all" in text
    assert len(summary(_grid(80), max_rows=None).splitlines()) > 80 and "means over" not in summary(_grid(80), max_rows=None)


def test_a_large_grid_is_averaged_over_its_last_axes_until_it_fits():
    """Issue 33 item 5: 10 x 20 x 3 cells end in 10 rows (means over seed, then b), counted, and say so."""
    ds = xr.Dataset({"c": (("a", "b", "seed"), np.arange(600.0).reshape(10, 20, 3)),
                     "done": (("a", "b", "seed"), np.ones((10, 20, 3), bool))},
                    coords={"a": np.arange(10), "b": np.arange(20), "seed": np.arange(3)})
    text = summary(ds, max_rows=60)
    lines = [ln for ln in text.splitlines() if ln.strip()[:1].isdigit()]
    assert len(lines) == 10 and all(ln.split()[-1] == "60" for ln in lines)  # n_used: 20 x 3 cells a row
    assert float(lines[0].split()[1]) == np.arange(60.0).mean()
    assert "means over seed, b" in text and "more rows" not in text
    assert len(summary(ds, max_rows=None).splitlines()) > 200  # show: every cell's row
