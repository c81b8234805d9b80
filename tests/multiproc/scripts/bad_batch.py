"""A gpuscale script given a global batch its ranks cannot share: every rank refuses it (a usage error).

argv: --batch N (the global batch; 33 does not divide among 2 ranks).
"""

import argparse

import gpuscale

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=32)
args = parser.parse_args()
with gpuscale.init() as rt:
    plan = gpuscale.plan_batch(args.batch, rt.world_size, scaling="strong")
    print(f"rank {rt.rank}: {plan.per_device_batch} samples per step")
