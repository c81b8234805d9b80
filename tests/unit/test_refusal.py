"""Which rendezvous a refusing rank tells of its refusal, and who hosts it (gpuscale.runtime.refusal)."""

from __future__ import annotations

from gpuscale.runtime import refusal


def test_only_a_rendezvous_no_launcher_supervises_is_told():
    hand = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "node1", "MASTER_PORT": "29500"}
    assert refusal._rendezvous(hand) == ("node1", 29500, 2)
    assert refusal._rendezvous({**hand, "TORCHELASTIC_USE_AGENT_STORE": "True"}) is None  # torchrun's agent ends its workers
    assert refusal._rendezvous({**hand, "WORLD_SIZE": "1"}) is None
    assert refusal._rendezvous({k: v for k, v in hand.items() if k != "MASTER_PORT"}) is None
    srun = {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "MASTER_ADDR": "nid001", "MASTER_PORT": "12345"}
    assert refusal._rendezvous(srun) == ("nid001", 12345, 4)


def test_only_a_rank_zero_every_launcher_variable_agrees_on_hosts_the_store():
    """RANK=0 expanded once by the batch shell, in the srun task with SLURM_PROCID=1: that task's node does not host
    the rendezvous, task 0's does."""
    assert refusal._is_rank_zero({"RANK": "0"}) and refusal._is_rank_zero({"SLURM_PROCID": "0"})
    assert not refusal._is_rank_zero({"RANK": "0", "SLURM_PROCID": "1"})
    assert not refusal._is_rank_zero({"RANK": "1"}) and not refusal._is_rank_zero({})
