"""Cloud TPU accelerator types (`v3-8`, `v5litepod-16`, ...): replicas, hosts and HBM per replica.

`parse("v4-32")` gives the `Target` a job on that slice runs on: how many replicas
TensorFlow's TPUStrategy makes, how many hosts feed them, and how much HBM each
replica has, for sizing a per-replica step before a TPU is rented. The numbers
come from one table, `GENERATIONS`, transcribed from the Cloud TPU documentation;
each row names its page.

What the number in a type counts differs by generation ("types and topologies",
https://cloud.google.com/tpu/docs/types-topologies): TensorCores for v2, v3, v4
and v5p (`v4-8` is 4 chips of 2 TensorCores), chips for v5e and v6e
(`v5litepod-8` is 8 chips of 1 TensorCore). Under TPUStrategy a replica is one
TensorCore on v2/v3, one chip on v4/v5p (their two TensorCores act as one
"megacore" device) and one chip on v5e/v6e (one TensorCore each): a `v3-8` has 8
replicas, a `v4-8` has 4, a `v5litepod-8` has 8.

All these generations lay arrays out in HBM with the same tiles (XLA's default
before TPU7x): `tpurun.check.sizing.memory.TILE_ROWS` applies to every row here.

The same rows give what a step's time and a run's price are bounded by: each
generation's peak bfloat16 FLOP/s and HBM bandwidth (`peak_flops_per_replica`,
`hbm_bandwidth_per_replica`, from the generation's Cloud TPU page) and its
on-demand price (`price_per_chip_hour`, of `PRICES_DATE`). A figure the docs do
not publish is None, with the reason in `missing_peaks` / `missing_price`: it is
left out of the bound, never guessed. `compile_topology` is what the TPU
compiler (`tpurun.check.sizing.tpu_compiler`) compiles one replica's step for. The vCPUs
of a slice's hosts (`host_vcpus`, which run the input pipeline) say how many
examples/s a host can make (`tpurun.check.bounds.host_input`); where no figure was found
(v2), none is guessed either.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

from tpurun.errors import UsageError

GIB = 1 << 30
GB = 10**9
TERA = 10**12

# On-demand list prices per chip-hour. The Cloud TPU pricing page
# (https://cloud.google.com/tpu/pricing) renders its table from Google's price
# catalog, by region; the figures below are its US on-demand prices as quoted, all
# alike, by the public notes that cite it (v4 $3.22, v5e $1.20, v5p $4.20, v6e
# $2.70), current on this date. Check the page for your region, or pass
# --price_per_chip_hour. No quote of a v2 or v3 on-demand chip-hour was found: those
# rows have no price, so the cost of a run on them needs --price_per_chip_hour.
PRICES_DATE = "2026-11"
PRICES_SOURCE = "https://cloud.google.com/tpu/pricing"

# A TPU VM host's vCPUs. v5e's are on its Cloud TPU page ("VM types": 24, 112 and
# 224 vCPUs for its 1-, 4- and 8-chip VMs). The other generations' pages give none:
# their figures are those of the Compute Engine machine types their TPU VMs are
# (the machine-type list's guestCpus, as recorded in
# github.com/Cyclenerd/google-cloud-pricing-cost-calculator, tools/machinetypes.csv):
# ct3-hightpu-4t (a v3-8) 96 and ct3p-hightpu-4t (a v3 Pod slice's hosts) 48,
# ct4p-hightpu-4t 240, ct5p-hightpu-4t 208, ct6e-standard-1t 44 and -4t 180. The
# 8-chip ct6e-standard-8t lists 360 but runs one thread per core (the Kubernetes
# cluster autoscaler's GCE machine configs, kubernetes/autoscaler), so 180. No v2
# figure was found.
MACHINE_TYPES_SOURCE = (
    "Compute Engine's TPU machine types, github.com/Cyclenerd/google-cloud-pricing-cost-"
    "calculator tools/machinetypes.csv"
)
ANY = 1 << 30  # chips: any larger slice


@dataclasses.dataclass(frozen=True)
class Generation:
    """One row of the table: a TPU version as the Cloud TPU docs describe it."""

    name: str  # as the docs name it: "v5e"
    prefix: str  # as accelerator types spell it: "v5litepod"
    aliases: tuple[str, ...]  # other spellings of the prefix users type: ("v5e",)
    counts: str  # what the number in the type counts: "TensorCores" or "chips"
    tensorcores_per_chip: int
    tensorcores_per_replica: int  # under TPUStrategy: 1, or 2 for a megacore chip
    chips_per_host: int  # of a full host; smaller slices have part of one
    hbm_bytes_per_chip: int
    sizes: Callable[[int], bool]  # whether `<prefix>-<n>` exists
    size_examples: str  # for messages: "8, 32, ..., 512"
    source: str  # the Cloud TPU page the row comes from
    # Peak bfloat16 FLOP/s and HBM bandwidth (bytes/s) per chip, from `source`; None
    # when the page does not publish it (`missing_peaks` says so).
    peak_flops_per_chip: float | None
    hbm_bandwidth_per_chip: float | None
    # US on-demand $ per chip-hour of PRICES_DATE (PRICES_SOURCE); None: not found.
    price_per_chip_hour: float | None
    # What the TPU compiler compiles one replica's step for: the smallest slice's
    # topology as libtpu names it, and its options (v4's megacore: one device a chip).
    compile_topology: str
    compile_options: tuple[tuple[str, str], ...] = ()
    # The vCPUs of one TPU VM host, which run the input pipeline: (largest slice in
    # chips, vCPUs of its hosts), smallest first; () where no figure was found. Read
    # by `host_vcpus` (tpurun.check.bounds.host_input: will the input keep up?).
    host_vcpus: tuple[tuple[int, int], ...] = ()
    host_source: str = ""  # where the vCPU figures come from

    def vcpus_per_host(self, chips: int) -> int | None:
        """The vCPUs of each host of a slice of `chips` chips; None if none was found."""
        return next((vcpus for most, vcpus in self.host_vcpus if chips <= most), None)

    @property
    def hbm_bytes_per_replica(self) -> int:
        return self.hbm_bytes_per_chip // self.tensorcores_per_chip * self.tensorcores_per_replica

    @property
    def chips_per_replica(self) -> float:
        """0.5 on v2/v3 (a replica is one of a chip's two TensorCores), else 1."""
        return self.tensorcores_per_replica / self.tensorcores_per_chip

    @property
    def peak_flops_per_replica(self) -> float | None:
        """Peak bfloat16 FLOP/s of one replica (a TensorCore on v2/v3, else a chip)."""
        if self.peak_flops_per_chip is None:
            return None
        return self.peak_flops_per_chip * self.chips_per_replica

    @property
    def hbm_bandwidth_per_replica(self) -> float | None:
        """HBM bytes/s of one replica; on v2/v3 half a chip's (each core has its own HBM)."""
        if self.hbm_bandwidth_per_chip is None:
            return None
        return self.hbm_bandwidth_per_chip * self.chips_per_replica

    @property
    def missing_peaks(self) -> str | None:
        """Why there is no time bound on this generation, or None when there is."""
        if self.peak_flops_per_chip is not None and self.hbm_bandwidth_per_chip is not None:
            return None
        return (
            f"the Cloud TPU {self.name} page ({self.source}) publishes no peak FLOP/s or HBM "
            "bandwidth, so no step-time bound is given"
        )

    @property
    def missing_price(self) -> str | None:
        """Why there is no price for this generation, or None when there is."""
        if self.price_per_chip_hour is not None:
            return None
        return (
            f"no on-demand price of a {self.name} chip-hour was found ({PRICES_SOURCE}); "
            "pass --price_per_chip_hour for the cost"
        )


def _one_of(*sizes: int) -> Callable[[int], bool]:
    return frozenset(sizes).__contains__


def _cube_slices(max_chips: int) -> Callable[[int], bool]:
    """v4/v5p: N TensorCores = N/2 chips in whole hosts of 4, arranged AxBxC.

    The types-and-topologies page: "A<=B<=C, and A, B, C are all <= 4 or all
    integer multiples of 4"; the smallest slice is one host (2x2x1).
    """

    def exists(tensorcores: int) -> bool:
        if tensorcores % 8 or not 8 <= tensorcores <= 2 * max_chips:
            return False
        chips = tensorcores // 2
        for a in range(1, chips + 1):
            for b in range(a, chips // a + 1):
                c, rest = divmod(chips, a * b)
                if rest or c < b:
                    continue
                dims = (a, b, c)
                if all(d <= 4 for d in dims) or all(d % 4 == 0 for d in dims):
                    return True
        return False

    return exists


GENERATIONS: tuple[Generation, ...] = (
    Generation(
        name="v2",
        prefix="v2",
        aliases=(),
        counts="TensorCores",
        tensorcores_per_chip=2,
        tensorcores_per_replica=1,
        chips_per_host=4,
        # 16 GiB per chip, 8 GiB per TensorCore.
        hbm_bytes_per_chip=16 * GIB,
        sizes=_one_of(8, 32, 128, 256, 512),
        size_examples="8, 32, 128, 256, 512",
        source="https://cloud.google.com/tpu/docs/v2",
        # The v2 page publishes no peak compute or HBM bandwidth (it refers to a paper):
        # left out of the bound rather than taken from elsewhere.
        peak_flops_per_chip=None,
        hbm_bandwidth_per_chip=None,
        price_per_chip_hour=None,
        compile_topology="v2:1x1",
    ),
    Generation(
        name="v3",
        prefix="v3",
        aliases=(),
        counts="TensorCores",
        tensorcores_per_chip=2,
        tensorcores_per_replica=1,
        chips_per_host=4,
        hbm_bytes_per_chip=32 * GIB,  # "HBM2 capacity: 32 GiB" (per chip)
        sizes=_one_of(8, 32, 64, 128, 256, 512, 1024, 2048),  # a Pod is 1024 chips
        size_examples="8, 32, 64, ..., 2048",
        source="https://cloud.google.com/tpu/docs/v3",
        peak_flops_per_chip=123 * TERA,  # "Peak compute per chip: 123 teraflops (bf16)"
        hbm_bandwidth_per_chip=900 * GB,  # "HBM2 capacity and bandwidth: 32 GiB, 900 GBps"
        price_per_chip_hour=None,
        compile_topology="v3:1x1",
        # A v3-8 is one ct3-hightpu-4t; a Pod slice's hosts are ct3p-hightpu-4t.
        host_vcpus=((4, 96), (ANY, 48)),
        host_source=MACHINE_TYPES_SOURCE,
    ),
    Generation(
        name="v4",
        prefix="v4",
        aliases=(),
        counts="TensorCores",
        tensorcores_per_chip=2,
        tensorcores_per_replica=2,  # megacore: one device per chip
        chips_per_host=4,
        hbm_bytes_per_chip=32 * GIB,  # "HBM2 capacity: 32 GiB"
        sizes=_cube_slices(max_chips=4096),  # a Pod is 4096 chips
        size_examples="8, 16, 32, ..., 8192",
        source="https://cloud.google.com/tpu/docs/v4",
        peak_flops_per_chip=275 * TERA,  # "Peak compute per chip: 275 teraflops (bf16 or int8)"
        hbm_bandwidth_per_chip=1200 * GB,  # "HBM2 capacity and bandwidth: 32 GiB, 1200 GBps"
        price_per_chip_hour=3.22,
        compile_topology="v4:1x1x1",
        compile_options=(("chip_config_name", "megacore"),),
        host_vcpus=((ANY, 240),),  # ct4p-hightpu-4t
        host_source=MACHINE_TYPES_SOURCE,
    ),
    Generation(
        name="v5e",
        prefix="v5litepod",
        aliases=("v5e",),
        counts="chips",
        tensorcores_per_chip=1,
        tensorcores_per_replica=1,
        chips_per_host=8,  # "Chips per host: 8"; 1x1 and 2x2 slices use part of one
        hbm_bytes_per_chip=16 * GB,  # "HBM capacity per chip: 16 GB"
        sizes=_one_of(1, 4, 8, 16, 32, 64, 128, 256),  # 1x1 ... 16x16
        size_examples="1, 4, 8, 16, ..., 256",
        source="https://cloud.google.com/tpu/docs/v5e",
        peak_flops_per_chip=197 * TERA,  # "Peak compute per chip (bf16): 197 TFLOPs"
        # "HBM2 capacity and bandwidth: 16 GB, 819 GBps" (a later revision of the page
        # says "800 GiBps", 859 GB/s: 5% more, so a bound 5% less memory-bound).
        hbm_bandwidth_per_chip=819 * GB,
        price_per_chip_hour=1.20,
        compile_topology="v5e:1x1",
        # "VM types": 1-chip 24 vCPUs, 4-chip 112, 8-chip 224 (larger slices: 8-chip VMs).
        host_vcpus=((1, 24), (4, 112), (ANY, 224)),
        host_source="https://cloud.google.com/tpu/docs/v5e",
    ),
    Generation(
        name="v5p",
        prefix="v5p",
        aliases=(),
        counts="TensorCores",
        tensorcores_per_chip=2,
        tensorcores_per_replica=2,  # megacore, as v4
        chips_per_host=4,  # 2x2x1 = 4 chips = 1 host
        hbm_bytes_per_chip=95 * GIB,  # "HBM capacity per chip (GiB): 95"
        sizes=_cube_slices(max_chips=6144),  # the largest slice: 16x16x24
        size_examples="8, 16, 32, ..., 12288",
        source="https://cloud.google.com/tpu/docs/v5p",
        peak_flops_per_chip=459 * TERA,  # "Peak compute per chip (bf16): 459 TFLOPs"
        hbm_bandwidth_per_chip=2765 * GB,  # "HBM2e capacity and bandwidth: 95 GB, 2765 GBps"
        price_per_chip_hour=4.20,
        compile_topology="v5p:1x1x1",
        host_vcpus=((ANY, 208),),  # ct5p-hightpu-4t
        host_source=MACHINE_TYPES_SOURCE,
    ),
    Generation(
        name="v6e",
        prefix="v6e",
        aliases=(),
        counts="chips",
        tensorcores_per_chip=1,
        tensorcores_per_replica=1,
        chips_per_host=8,  # "Chips per host: 8"
        hbm_bytes_per_chip=32 * GB,  # "HBM capacity per chip: 32 GB"
        sizes=_one_of(1, 4, 8, 16, 32, 64, 128, 256),  # a Pod is 256 chips
        size_examples="1, 4, 8, 16, ..., 256",
        source="https://cloud.google.com/tpu/docs/v6e",
        peak_flops_per_chip=918 * TERA,  # "Peak compute per chip (bf16): 918 TFLOPs"
        hbm_bandwidth_per_chip=1638 * GB,  # "HBM bandwidth per chip: 1638 GBps"
        price_per_chip_hour=2.70,
        compile_topology="v6e:1x1",
        # ct6e-standard-1t 44, -4t 180, -8t 180 (one thread per core; larger slices are
        # counted in 8-chip hosts, as `chips_per_host`: if theirs are 4-chip VMs of 180
        # vCPUs, a host has twice the vCPUs per chip assumed here).
        host_vcpus=((1, 44), (4, 180), (ANY, 180)),
        host_source=MACHINE_TYPES_SOURCE,
    ),
)

_BY_PREFIX = {p: g for g in GENERATIONS for p in (g.prefix, *g.aliases)}
_BY_NAME = {g.name: g for g in GENERATIONS}
_TYPE = re.compile(r"([a-z0-9]+?)-(\d+)")


@dataclasses.dataclass(frozen=True)
class Target:
    """A slice as TPUStrategy sees it: its replicas, hosts and HBM per replica."""

    name: str  # canonical accelerator type: "v5litepod-16" (for "v5e-16" too)
    generation: str  # "v5e"
    chips: int
    replicas: int  # TPUStrategy.num_replicas_in_sync
    hosts: int  # full hosts, at least 1 (a v5litepod-4 uses half of one)
    hbm_bytes_per_replica: int


def parse(type_name: str) -> Target:
    """The Target of an accelerator type, or UsageError naming the known ones."""
    match = _TYPE.fullmatch(type_name.strip().lower())
    generation = _BY_PREFIX.get(match.group(1)) if match else None
    if match is None or generation is None:
        raise UsageError(f"unknown TPU type {type_name!r}; known: {_known_line()}")
    number = int(match.group(2))
    if not generation.sizes(number):
        raise UsageError(
            f"{type_name!r} is not a Cloud TPU {generation.name} slice (the number counts "
            f"{generation.counts}); use {generation.prefix}-N for N in "
            f"{{{generation.size_examples}}}"
        )
    if generation.counts == "chips":
        chips, tensorcores = number, number * generation.tensorcores_per_chip
    else:
        tensorcores, chips = number, number // generation.tensorcores_per_chip
    replicas = tensorcores // generation.tensorcores_per_replica
    return Target(
        name=f"{generation.prefix}-{number}",
        generation=generation.name,
        chips=chips,
        replicas=replicas,
        hosts=max(1, chips // generation.chips_per_host),
        hbm_bytes_per_replica=generation.hbm_bytes_per_replica,
    )


def larger_slice(target: Target, global_batch: int, max_per_replica: int) -> Target | None:
    """The smallest slice of the target's generation with more replicas, over which
    `global_batch` splits evenly into per-replica batches of at most `max_per_replica`;
    None if there is none."""
    generation = _BY_NAME[target.generation]
    divisors = [d for d in range(1, math.isqrt(global_batch) + 1) if global_batch % d == 0]
    for replicas in sorted({*divisors, *(global_batch // d for d in divisors)}):
        if replicas <= target.replicas or global_batch // replicas > max_per_replica:
            continue
        tensorcores = replicas * generation.tensorcores_per_replica
        number = (
            tensorcores
            if generation.counts == "TensorCores"
            else tensorcores // generation.tensorcores_per_chip
        )
        if generation.sizes(number):
            return parse(f"{generation.prefix}-{number}")
    return None


def host_vcpus(target: Target) -> int | None:
    """The vCPUs of each of the target's hosts (TPU VMs); None where none was found (v2)."""
    return _BY_NAME[target.generation].vcpus_per_host(target.chips)


def generation(name: str) -> Generation:
    """The row of a generation by its name ("v5e"), as `Target.generation` holds it."""
    return _BY_NAME[name]


def known_types() -> list[str]:
    """One entry per generation, for messages: "v3-{8, 32, 64, ..., 2048}", ..."""
    entries = []
    for g in GENERATIONS:
        alias = f" (or {', '.join(a + '-N' for a in g.aliases)})" if g.aliases else ""
        entries.append(f"{g.prefix}-N for N in {{{g.size_examples}}}{alias}")
    return entries


def _known_line() -> str:
    return "; ".join(known_types())
