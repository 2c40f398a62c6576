"""Running a job on Dask: connecting to a cluster (``connect``), the one loop that submits work
items and collects their results (``runner``), progress, Ctrl-C, and the local workers' forkserver."""
