"""`gpuscale profiles [NAME]`: list the cluster profiles gpuscale knows, or show one.

Profiles are looked up in $GPUSCALE_PROFILES, ~/.config/gpuscale/profiles, then the built-in ones;
a user's file of the same name wins. Add your cluster by copying one:

    gpuscale profiles generic-nvidia --raw > ~/.config/gpuscale/profiles/mycluster.toml
"""

from __future__ import annotations

import argparse
from typing import Any

from gpuscale.cli.verbs import verb_parser
from gpuscale.slurm.billing import rule_words
from gpuscale.slurm.profiles import Profile, list_profiles, load_profile

EPILOG = """examples:
  gpuscale profiles
  gpuscale profiles lumi-g
  gpuscale profiles generic-nvidia --raw > ~/.config/gpuscale/profiles/mycluster.toml
"""


def add_parser(subparsers: Any) -> None:
    parser = verb_parser(subparsers, "profiles", __doc__, EPILOG)
    parser.add_argument("name", nargs="?", help="profile to show (a name or a .toml path)")
    parser.add_argument("--raw", action="store_true", help="print the profile's TOML file as it is")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.name:
        for name, path in sorted(list_profiles().items()):
            try:
                description = load_profile(str(path)).description
            except ValueError as exc:  # a broken user profile is listed with its error, not hidden
                description = f"INVALID: {exc}"
            print(f"{name:16s} {description}  [{path}]")
        return 0
    profile = load_profile(args.name)
    if args.raw:
        print(open(profile.source).read(), end="")
        return 0
    print(f"{profile.name}: {profile.description}")
    print(f"  file        {profile.source}")
    print(f"  node        {profile.gpus_per_node} GPU(s) ({profile.gpu_vendor}), {profile.cpus_per_node} usable cores, "
          f"{profile.cpus_per_gpu()} cores per GPU" + (f", {profile.mem_per_gpu} per GPU" if profile.mem_per_gpu else "")
          + (f" (at most {profile.node_mem} a node)" if profile.node_mem else "")
          + ("" if profile.full_node_mem is None else ", whole nodes: all their memory (--mem=0)" if profile.full_node_mem == "0"
             else f", whole nodes: --mem={profile.full_node_mem}"))
    _print_partitions(profile)
    for name in profile.partitions:
        rule = rule_words(profile, name)
        if rule:
            print(f"  billing     {rule}")
    if profile.billing_source:
        print(f"  billing     rule from {profile.billing_source}")
    masks = profile.cpu_masks(profile.gpus_per_node) or []
    for index, (cores, mask) in enumerate(zip(profile.gpu_cores or (), masks, strict=True)):
        print(f"  GPU {index}       cores {cores}  mask {mask}")
    if profile.container:
        how = "srun --container-image (pyxis)" if profile.container.exec == "pyxis" else profile.container.exec
        print(f"  container   {how} (binds {', '.join(profile.container.binds) or 'none'}), "
              f"activate {profile.container.activate or 'nothing'}"
              + (f", default image {profile.container.image}" if profile.container.image else ""))
    for pattern in profile.containers:
        setup = profile.container_for(pattern, pattern=pattern)
        needs = [f"start with {setup.exec}"] + ([f"activate {setup.activate}"] if setup.activate else [])
        needs += [f"module use {' '.join(setup.module_use)}"] if setup.module_use else []
        needs += [f"module load {' '.join(setup.modules)}"] if setup.modules else []
        needs += [f"bind {','.join(setup.binds)}"] if setup.binds else []
        needs += [f"{k}={v}" for k, v in setup.env.items()]
        print(f"  image       {pattern}: {'; '.join(needs)}")
    requires = [what for what, on in (("--account", profile.require_account),
                                      ("a software environment (--container, --module, --venv or --no-container)", profile.require_software)) if on]
    if requires:
        print(f"  requires    {' and '.join(requires)}")
    if profile.clean_modules:
        print("  starts      from a clean module environment (module --quiet purge; inherited SINGULARITYENV_* cleared)")
    for name, value in {**profile.env, **profile.env_shell}.items():
        print(f"  env         {name}={value}")
    if profile.node_dirs:
        print(f"  makes       the folders of {', '.join(profile.node_dirs)} on every node, before the script starts")
    if profile.forbid_cpus_per_gpu:
        print("  refuses     --cpus-per-gpu")
    return 0


def _print_partitions(profile: Profile) -> None:
    """The profile's partitions, each with its limits and the jobs it is the default for; others, where it takes them."""
    for name, part in profile.partitions.items():
        role = [r for r, p in (("full nodes", profile.full_node_partition), ("partial nodes", profile.partial_node_partition)) if p == name]
        print(f"  partition   {name}: {'whole nodes' if part.whole_node else 'shared nodes (CPU masks need --exclusive)'}, "
              + (f"max {part.max_time}" if part.max_time else "time limit SLURM's")
              + (f", max {part.max_nodes} nodes" if part.max_nodes else "") + (f"  [default for {' and '.join(role)}]" if role else ""))
    if profile.other_partitions:
        unlisted = sorted({profile.full_node_partition, profile.partial_node_partition} - set(profile.partitions))
        print("  partition   any other named with --partition: taken as sharing nodes, its limits SLURM's"
              + (f" (default: {', '.join(unlisted)})" if unlisted else ""))
