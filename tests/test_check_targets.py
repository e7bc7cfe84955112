"""tpurun.check.targets: each generation's replicas and HBM per replica, aliases, bad types."""

from __future__ import annotations

import pytest

from tpurun.check import targets
from tpurun.errors import UsageError

GIB = 1 << 30
GB = 10**9


@pytest.mark.parametrize(
    "name, generation, chips, replicas, hosts, hbm_per_replica",
    [
        # v2/v3: the number counts TensorCores; one replica per TensorCore.
        ("v2-8", "v2", 4, 8, 1, 8 * GIB),
        ("v2-32", "v2", 16, 32, 4, 8 * GIB),
        ("v2-512", "v2", 256, 512, 64, 8 * GIB),
        ("v3-8", "v3", 4, 8, 1, 16 * GIB),
        ("v3-32", "v3", 16, 32, 4, 16 * GIB),
        ("v3-2048", "v3", 1024, 2048, 256, 16 * GIB),
        # v4/v5p: TensorCores too, but a megacore chip is one replica with all its HBM.
        ("v4-8", "v4", 4, 4, 1, 32 * GIB),
        ("v4-32", "v4", 16, 16, 4, 32 * GIB),
        ("v4-8192", "v4", 4096, 4096, 1024, 32 * GIB),
        ("v5p-8", "v5p", 4, 4, 1, 95 * GIB),
        ("v5p-128", "v5p", 64, 64, 16, 95 * GIB),
        ("v5p-12288", "v5p", 6144, 6144, 1536, 95 * GIB),
        # v5e/v6e: the number counts chips of one TensorCore; up to 8 chips on one host.
        ("v5litepod-1", "v5e", 1, 1, 1, 16 * GB),
        ("v5litepod-4", "v5e", 4, 4, 1, 16 * GB),
        ("v5litepod-8", "v5e", 8, 8, 1, 16 * GB),
        ("v5litepod-16", "v5e", 16, 16, 2, 16 * GB),
        ("v5litepod-256", "v5e", 256, 256, 32, 16 * GB),
        ("v6e-1", "v6e", 1, 1, 1, 32 * GB),
        ("v6e-8", "v6e", 8, 8, 1, 32 * GB),
        ("v6e-16", "v6e", 16, 16, 2, 32 * GB),
        ("v6e-256", "v6e", 256, 256, 32, 32 * GB),
    ],
)
def test_replicas_hosts_and_hbm_per_replica(
    name, generation, chips, replicas, hosts, hbm_per_replica
):
    target = targets.parse(name)
    assert (target.name, target.generation) == (name, generation)
    assert (target.chips, target.replicas, target.hosts) == (chips, replicas, hosts)
    assert target.hbm_bytes_per_replica == hbm_per_replica


@pytest.mark.parametrize("alias, name", [("v5e-8", "v5litepod-8"), ("v5e-256", "v5litepod-256")])
def test_v5e_is_an_alias_of_v5litepod(alias, name):
    assert targets.parse(alias) == targets.parse(name)
    assert targets.parse(alias).name == name


def test_case_and_spaces_are_ignored():
    assert targets.parse(" V3-8 ") == targets.parse("v3-8")


@pytest.mark.parametrize("name", ["v4-24", "v4-128", "v5p-48", "v5p-1024"])
def test_any_whole_host_cube_slice_exists(name):
    # AxBxC with every side <= 4 or every side a multiple of 4: 2x2x3, 4x4x4, 2x3x4, 8x8x8.
    assert targets.parse(name).chips == int(name.split("-")[1]) // 2


@pytest.mark.parametrize("name", ["v7-8", "tpu-v3-8", "v3", "v3-", "v3-eight", "", "gpu-8"])
def test_unknown_type_lists_the_known_ones_on_one_line(name):
    with pytest.raises(UsageError) as raised:
        targets.parse(name)
    message = str(raised.value)
    assert message.startswith(f"unknown TPU type {name!r}; known: ")
    assert "\n" not in message
    for prefix in ("v2-N", "v3-N", "v4-N", "v5litepod-N", "v5e-N", "v5p-N", "v6e-N"):
        assert prefix in message
    assert raised.value.exit_code == 2


@pytest.mark.parametrize(
    "name, counts, fix",
    [
        ("v3-16", "TensorCores", "use v3-N for N in {8, 32, 64, ..., 2048}"),
        ("v2-1024", "TensorCores", "use v2-N for N in {8, 32, 128, 256, 512}"),
        ("v4-4", "TensorCores", "use v4-N for N in {8, 16, 32, ..., 8192}"),
        ("v4-40", "TensorCores", "use v4-N"),  # 20 chips: 2x2x5 is no slice
        ("v5p-16384", "TensorCores", "use v5p-N for N in {8, 16, 32, ..., 12288}"),
        ("v5litepod-2", "chips", "use v5litepod-N for N in {1, 4, 8, 16, ..., 256}"),
        ("v5e-512", "chips", "use v5litepod-N"),
        ("v6e-12", "chips", "use v6e-N for N in {1, 4, 8, 16, ..., 256}"),
    ],
)
def test_a_size_that_does_not_exist_says_what_the_number_counts(name, counts, fix):
    with pytest.raises(UsageError, match=f"the number counts {counts}") as raised:
        targets.parse(name)
    assert fix in str(raised.value)


def test_known_types_name_every_generation_with_example_sizes():
    known = targets.known_types()
    assert len(known) == len(targets.GENERATIONS)
    assert known[1] == "v3-N for N in {8, 32, 64, ..., 2048}"
    assert known[3] == "v5litepod-N for N in {1, 4, 8, 16, ..., 256} (or v5e-N)"


def test_every_generation_names_its_source():
    for generation in targets.GENERATIONS:
        assert generation.source.startswith("https://cloud.google.com/tpu/docs/")


@pytest.mark.parametrize(
    "name, global_batch, max_per_replica, larger",
    [
        ("v5e-8", 16384, 1528, "v5litepod-16"),  # 1024 per replica on 16
        ("v5e-8", 32768, 1000, "v5litepod-64"),  # 32 would give 1024
        ("v3-8", 1024, 100, "v3-32"),  # no v3-16: 32 cores, 32 per replica
        ("v4-8", 4096, 600, "v4-16"),  # 8 megacore replicas of 512
        ("v5p-8", 96, 8, "v5p-24"),  # 12 replicas (2x2x3 chips) of 8
        ("v6e-256", 4096, 8, None),  # no v6e slice beyond 256 chips
        ("v5e-8", 1000, 10, None),  # 100 replicas would do, but 1000 has no slice-sized divisor
    ],
)
def test_the_next_slice_that_splits_the_batch_small_enough(
    name, global_batch, max_per_replica, larger
):
    found = targets.larger_slice(targets.parse(name), global_batch, max_per_replica)
    assert (found.name if found else None) == larger
    if found:
        assert global_batch % found.replicas == 0
        assert global_batch // found.replicas <= max_per_replica


@pytest.mark.parametrize(
    "name, vcpus",
    [
        ("v2-8", None),  # no figure found
        ("v3-8", 96),  # ct3-hightpu-4t
        ("v3-32", 48),  # a Pod slice's hosts: ct3p-hightpu-4t
        ("v4-8", 240),
        ("v4-32", 240),
        ("v5litepod-1", 24),  # the v5e page's 1-, 4- and 8-chip VMs
        ("v5litepod-4", 112),
        ("v5e-8", 224),
        ("v5litepod-16", 224),
        ("v5p-8", 208),
        ("v6e-1", 44),
        ("v6e-4", 180),
        ("v6e-8", 180),  # ct6e-standard-8t's 360, one thread per core
    ],
)
def test_the_vcpus_of_each_host_that_feeds_a_slice(name, vcpus):
    assert targets.host_vcpus(targets.parse(name)) == vcpus


def test_every_vcpu_figure_names_where_it_comes_from():
    for generation in targets.GENERATIONS:
        if generation.host_vcpus:
            assert generation.host_source, generation.name
            assert generation.host_vcpus[-1][0] >= 1 << 20  # any larger slice is covered
