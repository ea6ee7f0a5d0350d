"""Doctest collection over the package: optional subpackages whose
dependencies are missing are skipped, not failed (``spfuse.dask`` needs the
``dask`` extra)."""
import importlib.util

collect_ignore_glob = []
if importlib.util.find_spec("dask") is None or importlib.util.find_spec("distributed") is None:
    collect_ignore_glob += ["dask/*", "bench/dask_suite.py"]
