"""A training script that fails: the job must be reported as failed, with its exit code."""

import sys

import gpuscale

with gpuscale.init():
    sys.exit(3)
