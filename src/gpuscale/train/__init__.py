"""Training layer: what a script calls each step.

`step`: `setup`/`Training` (the model and optimizer built for the strategy; backward, step, no_sync);
`checkpoint`: `Checkpointer`, saving and resuming across kills and world sizes; `lr`: `scale_lr`, the learning
rate for the global batch; `preempt`: `StopSignal`, a clean stop on SLURM's warning signal.
"""
