"""SLURM: cluster profiles (TOML data), batch scripts rendered from them (pure), and job control.

- `profiles`: load and validate a cluster's description (`times`: SLURM's time limits; `values`:
  what a batch script may carry);
- `jobspec`: what one job asks for; `validate`: check it against the profile, into a `JobPlan`;
- `render`: `render_sbatch(profile, job) -> str`, pure and deterministic (`stopping`: its lines for
  SLURM's warning, scancel and the requeue of a job that stopped at a checkpoint);
- `cluster`: a study's or a run's job from the CLI's options;
- `jobs`: the only module that runs sbatch, squeue, scontrol and scancel.
"""
