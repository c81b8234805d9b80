"""LUMI-G for tests: the real images' names, and the profile without its two requirements for tests about other things.

lumi-g requires an account and a software environment (`gpuscale.slurm.validate`); a test of, say, CPU masks or
torchrun's options would otherwise have to name both in every job. Tests of the requirements themselves, and the
golden scripts a user keeps, use the real profile.
"""

from gpuscale.slurm.profiles import Profile, load_profile

AI_FACTORY_IMAGE = ("/appl/local/laifs/containers/lumi-multitorch-u24r70f21m50t210-20260415_130625/"
                    "lumi-multitorch-full-u24r70f21m50t210-20260415_130625.sif")
"""A LUMI AI Factory image, as the LUMI AI guide names it (2026)."""
OLD_IMAGE = "/appl/local/containers/sif-images/lumi-pytorch-rocm-6.2.4-python-3.12-pytorch-v2.7.1.sif"
"""One of LUMI's earlier PyTorch images (activated by $WITH_CONDA)."""


def lumi_g_for_other_tests() -> Profile:
    """lumi-g as a user gets it with --set require_account=false --set require_software=false."""
    return load_profile("lumi-g", {"require_account": False, "require_software": False})
