"""Set-up layer: a process placed, bound and joined to its group, and fed its exact share of the data.

`init`: `gpuscale.init()` and the `Runtime` it builds; `placement` and `pinning`: each rank's device and cores,
planned (pinning without torch, for the start-up hook); `failures`: a failing rank says so, first and once;
`teardown`: ending a gloo group; `data`: exact global batches and sharded loaders; `sample_seeds`: loader
workers' seeds; `sharded`: sharded state; `speed`: fast defaults on a GPU.

This package's ``__init__`` imports nothing: the start-up hook imports `pinning` before any script's first line.
"""
