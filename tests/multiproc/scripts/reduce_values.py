"""gpuscale.all_reduce_sum and all_reduce_max on every rank, given floats, one-element tensors and a 1-D tensor:
rank r contributes (r + 1, 10 (r + 1)); rank 0 writes what each call returned to OUT/reduced.json."""

import json
import sys
import warnings
from pathlib import Path

import torch

import gpuscale

with gpuscale.init() as rt, warnings.catch_warnings():
    warnings.simplefilter("error")  # torch's "To copy construct from a tensor" warning was once printed on every rank
    mine = [float(rt.rank + 1), 10.0 * (rt.rank + 1)]
    given = {"floats": mine, "tensors": [torch.tensor(v) for v in mine], "one_d": torch.tensor(mine)}
    reduced = {name: {"sum": gpuscale.all_reduce_sum(values), "max": gpuscale.all_reduce_max(values)} for name, values in given.items()}
    kinds = sorted({type(v).__name__ for r in reduced.values() for values in r.values() for v in values})
    if rt.is_main:
        Path(sys.argv[1], "reduced.json").write_text(json.dumps({"reduced": reduced, "kinds": kinds}))
