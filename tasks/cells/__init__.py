"""One module per experiment: the pure function from a bundle's cells (parameter dicts) and
tensors to the numbers the experiment stores. No files, Prefect, Dask or Zarr here."""
