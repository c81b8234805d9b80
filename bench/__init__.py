"""gpuscale's benchmarks: `python -m bench [NAME ...]`; see `bench.__main__` and BENCHMARKS.md."""
