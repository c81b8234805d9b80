"""Unit tests for gpuscale.detect.topology's pure functions: cpulists, even splits, binding plans."""

from __future__ import annotations

import itertools

import pytest

from gpuscale.detect.topology import BindingPlan, format_cpulist, parse_cpulist, plan_binding, split_evenly

# LUMI-G (docs/clusters.md, LUMI-G): 64 cores, 0, 8, ..., 56 reserved; GCD -> nearest cores.
LUMI_ALLOWED = [c for c in range(64) if c % 8 != 0]
LUMI_GCD_CORES = [
    list(range(49, 56)),  # GCD0
    list(range(57, 64)),  # GCD1
    list(range(17, 24)),  # GCD2
    list(range(25, 32)),  # GCD3
    list(range(1, 8)),    # GCD4
    list(range(9, 16)),   # GCD5
    list(range(33, 40)),  # GCD6
    list(range(41, 48)),  # GCD7
]


def assert_disjoint(shares):
    for a, b in itertools.combinations(shares, 2):
        assert not set(a) & set(b), (a, b)


# --------------------------------------------------------------------------------------------------
# cpulists


@pytest.mark.parametrize("text,cores", [
    ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
    ("0", [0]),
    ("5-5", [5]),
    ("0-7\n", list(range(8))),
    (" 1-3 , 9 ", [1, 2, 3, 9]),
    ("8,0-2", [0, 1, 2, 8]),
    ("0-3,2-5", [0, 1, 2, 3, 4, 5]),
    ("0-15:4", [0, 4, 8, 12]),
    ("0-15:2/4", [0, 2, 4, 6, 8, 10, 12, 14]),
    ("", []),
    ("\n", []),
])
def test_parse_cpulist(text, cores):
    assert parse_cpulist(text) == cores


@pytest.mark.parametrize("cores,text", [
    ([0, 1, 2, 3, 8], "0-3,8"),
    ([0, 1, 2, 3, 8, 10, 11], "0-3,8,10-11"),
    ([5], "5"),
    ([], ""),
    ([3, 1, 2, 2], "1-3"),
    ([0, 2, 4], "0,2,4"),
    (LUMI_ALLOWED, "1-7,9-15,17-23,25-31,33-39,41-47,49-55,57-63"),
])
def test_format_cpulist(cores, text):
    assert format_cpulist(cores) == text


@pytest.mark.parametrize("cores", [
    [0], [0, 1], list(range(64)), LUMI_ALLOWED, [1, 3, 5, 7], [0, 1, 2, 10, 11, 40], list(range(100, 228)),
])
def test_cpulist_round_trips(cores):
    text = format_cpulist(cores)
    assert parse_cpulist(text) == sorted(cores)
    assert format_cpulist(parse_cpulist(text)) == text


# --------------------------------------------------------------------------------------------------
# split_evenly


@pytest.mark.parametrize("n,parts", [(8, 2), (8, 8), (10, 3), (7, 4), (56, 8), (56, 3), (5, 1)])
def test_split_evenly_disjoint_contiguous_cover(n, parts):
    cores = list(range(100, 100 + n))
    shares = split_evenly(cores, parts)
    assert len(shares) == parts
    assert_disjoint(shares)
    assert sorted(c for s in shares for c in s) == cores  # nothing lost
    for s in shares:
        assert list(s) == list(range(s[0], s[0] + len(s)))  # contiguous
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the first shares get the extra cores


def test_split_evenly_uneven_example():
    assert split_evenly(range(10), 3) == [(0, 1, 2, 3), (4, 5, 6), (7, 8, 9)]


def test_split_evenly_unsorted_and_duplicate_input():
    assert split_evenly([3, 1, 2, 0, 1], 2) == [(0, 1), (2, 3)]


def test_split_evenly_fewer_cores_than_parts_shares_round_robin():
    assert split_evenly([4, 5], 5) == [(4,), (5,), (4,), (5,), (4,)]


def test_split_evenly_invalid():
    with pytest.raises(ValueError):
        split_evenly([0, 1], 0)
    with pytest.raises(ValueError):
        split_evenly([], 2)


# --------------------------------------------------------------------------------------------------
# plan_binding


def test_cpu_only_even_split():
    plan = plan_binding(range(16), 4)
    assert plan.source == "even-split"
    assert plan.note is None
    assert plan.cores == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15))
    assert plan.for_rank(2) == (8, 9, 10, 11)


def test_cpu_only_uneven_split_uses_every_core():
    plan = plan_binding([0, 1, 2, 3, 4], 2)
    assert plan.cores == ((0, 1, 2), (3, 4))


def test_single_rank_gets_all_allowed_cores():
    assert plan_binding(LUMI_ALLOWED, 1).cores == (tuple(LUMI_ALLOWED),)


def test_lumi_one_gcd_per_rank_gets_exactly_its_cores():
    plan = plan_binding(LUMI_ALLOWED, 8, LUMI_GCD_CORES)
    assert plan.source == "gpu-local"
    assert plan.note is None
    for rank, cores in enumerate(LUMI_GCD_CORES):
        assert plan.for_rank(rank) == tuple(cores)
    assert_disjoint(plan.cores)


def test_lumi_gcd_maps_given_as_whole_ccd_keep_reserved_cores_out():
    # sysfs may report the whole CCD (48-55) next to GCD0; the reserved core 48 is not allowed.
    gpu_cores = [list(range(c[0] - 1, c[-1] + 1)) for c in LUMI_GCD_CORES]
    plan = plan_binding(LUMI_ALLOWED, 8, gpu_cores)
    assert plan.source == "gpu-local"
    for rank, cores in enumerate(LUMI_GCD_CORES):
        assert plan.for_rank(rank) == tuple(cores)


def test_lumi_partial_node_four_gcds():
    # small-g --exclusive style: four ranks on GCD4..GCD7, all 56 cores allowed.
    plan = plan_binding(LUMI_ALLOWED, 4, LUMI_GCD_CORES[4:])
    assert plan.cores == tuple(tuple(c) for c in LUMI_GCD_CORES[4:])


def test_several_gpus_sharing_one_socket_split_its_cores():
    # Two sockets of 16 cores, 4 GPUs on each: every rank gets 4 cores of its GPU's socket.
    socket0, socket1 = list(range(16)), list(range(16, 32))
    gpu_cores = [socket0] * 4 + [socket1] * 4
    plan = plan_binding(range(32), 8, gpu_cores)
    assert plan.source == "gpu-local"
    assert plan.note is None
    assert_disjoint(plan.cores)
    for rank in range(8):
        home = socket0 if rank < 4 else socket1
        assert set(plan.for_rank(rank)) <= set(home)
        assert len(plan.for_rank(rank)) == 4
    assert plan.cores[0] == (0, 1, 2, 3) and plan.cores[7] == (28, 29, 30, 31)


def test_gpus_sharing_a_socket_with_interleaved_ranks():
    socket0, socket1 = list(range(8)), list(range(8, 16))
    plan = plan_binding(range(16), 4, [socket0, socket1, socket0, socket1])
    assert plan.cores == ((0, 1, 2, 3), (8, 9, 10, 11), (4, 5, 6, 7), (12, 13, 14, 15))


def test_gpu_nearby_cores_restricted_to_allowed():
    # Only cores 4-11 allowed: each GPU's nearby set is cut down to the allowed part.
    plan = plan_binding(range(4, 12), 2, [range(0, 8), range(8, 16)])
    assert plan.source == "gpu-local"
    assert plan.cores == ((4, 5, 6, 7), (8, 9, 10, 11))


@pytest.mark.parametrize("gpu_cores", [
    [list(range(8)), None],
    [None, None],
    [list(range(8)), []],
    [list(range(8)), list(range(100, 108))],  # nearby cores all outside allowed
])
def test_unknown_gpu_cores_fall_back_to_even_split_with_note(gpu_cores):
    plan = plan_binding(range(16), 2, gpu_cores)
    assert plan.source == "even-split"
    assert plan.cores == (tuple(range(8)), tuple(range(8, 16)))
    assert plan.note and "1" in plan.note and "evenly" in plan.note


def test_fewer_cores_than_ranks_shares_cores_with_note():
    plan = plan_binding([0, 1], 4)
    assert plan.source == "even-split"
    assert len(plan.cores) == 4
    assert all(len(c) == 1 for c in plan.cores)
    assert {c for cores in plan.cores for c in cores} == {0, 1}
    assert plan.note and "4 local ranks" in plan.note and "2 cores" in plan.note


def test_fewer_cores_than_ranks_with_gpu_map_still_plans_every_rank():
    plan = plan_binding([0, 1], 4, [[0, 1]] * 4)
    assert len(plan.cores) == 4 and plan.note


def test_gpu_group_with_fewer_cores_than_ranks_notes_sharing():
    # 3 GPUs next to the same 2 cores (and one more GPU elsewhere).
    plan = plan_binding(range(8), 4, [[0, 1], [0, 1], [0, 1], [4, 5, 6, 7]])
    assert plan.source == "gpu-local"
    assert plan.cores[3] == (4, 5, 6, 7)
    assert plan.note and "share 2 cores" in plan.note


def test_gpu_cores_length_mismatch_fails():
    with pytest.raises(ValueError, match="3 entries for 2 local ranks"):
        plan_binding(range(8), 2, [[0], [1], [2]])


def test_partially_overlapping_gpu_core_sets_still_give_disjoint_cores():
    plan = plan_binding(range(16), 2, [range(0, 10), range(6, 16)])
    assert_disjoint(plan.cores)


def test_binding_plan_is_a_value():
    assert BindingPlan(((0,),), "none") == BindingPlan(((0,),), "none")
