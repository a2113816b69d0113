"""The results store: chunked Zarr (format 3), one group per experiment, opened as xarray."""

SHOWN_DAMAGED = 5  # damaged, failed or stale cells a short listing names: kktlab status, show, run (verify names all)
