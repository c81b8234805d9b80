"""Cluster layer: launching the ranks of one node.

`agent`: torchrun's elastic agent on one node, for `gpuscale run` and a batch script's node task, ending with
gpuscale's account of what failed first; `verdicts`: the launcher's side of a failure (which rank failed first,
the last line). Batch scripts run it as ``python -m gpuscale.agent``; beside it, `gpuscale.slurm` writes and
follows the jobs.
"""
