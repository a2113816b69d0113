"""Prefect flows: wiring only (config -> grid -> bundles -> Dask -> tasks -> storage)."""
