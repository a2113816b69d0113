"""kktlab: Prefect + Dask + Zarr workflows for the implicit-bias papers (see README.md)."""

__version__ = "0.1.0"
