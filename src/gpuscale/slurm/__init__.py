"""SLURM: cluster profiles (TOML data), batch scripts rendered from them (pure), and job control.

- `profiles`: load and validate a cluster's description;
- `render`: `render_sbatch(profile, job) -> str`, pure and deterministic;
- `jobs`: the only module that runs sbatch, squeue, scontrol and scancel.
"""
