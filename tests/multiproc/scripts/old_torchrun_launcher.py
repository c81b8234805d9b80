"""`python -m gpuscale ARGS` as on a torch before 2.10, whose torchrun has no --signals-to-handle (so it passes
on TERM, INT, HUP and QUIT only): gpuscale's test of the option answers no, the rest is the installed torch."""

import sys

import gpuscale.cli
import gpuscale.cli.run

gpuscale.cli.run.handles_signals_option = lambda parser=None: False
sys.exit(gpuscale.cli.main(sys.argv[1:]))
