"""Detection layer: where a process is, found without changing anything.

`env`: which launcher started it and its ranks (torchrun, srun, mpirun, hand-set); `topology`: GPUs and the cores
next to them; `slurmlists`: SLURM's host and task lists; `launchtime`: when the run was launched; `secrets`:
tokens shown without leaking; `log`: the ranks' logs.
"""
