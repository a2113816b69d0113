"""The results store: chunked Zarr (format 3), one group per experiment, opened as xarray."""
