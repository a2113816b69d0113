"""Running kktlab beyond one laptop: Dask cluster specs, Prefect deployments."""
