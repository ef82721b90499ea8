"""AWS GPU instance types: the figures, each with the source it came from.

Every figure here is taken from `shared/reference/mps-and-gpu-health.md`, section 3 ("GPU instance
catalog (AWS) for capacity planning": 3.1 sources and markers, 3.2 table, 3.3 launch-coverage
claims). Nothing is filled in from memory. Each figure is written as ``(value, "markers")`` where the
markers are the reference's own (see `SOURCES`):

* ``A``: AWS EC2 "Accelerated computing" instance specifications (GPU memory there is usable GiB);
* ``S``: the SkyPilot catalog scrape of the AWS price list (prices, regions, GPU memory in MiB);
* ``launch``: 2026 launch coverage of the P6 instances;
* ``3p``: third-party news or summaries;
* ``?``: not in the reference, or marked there as not found / unverified. The value is then None.

Two conventions on top of the reference's markers:

* The reference's g-family rows carry markers only in their first row, and a table note says "All
  g-family specifications (GPU count, memory, vCPU, RAM, network, EFA) come from [A]"; those cells
  are recorded here as ``A``.
* ``derived``: per-GPU memory in MiB for H100 and A100, which the reference gives only in GiB
  ([A]); the MiB figure is that GiB figure × 1024. It is approximate (AWS rounds the GiB), and
  marked unconfirmed. The MPS per-client limits must come from NVML ``memory.total`` at runtime
  anyway (reference §3.2 notes), never from this table.

A marker of ``n/a`` means the figure does not apply (a baseline for a fixed-bandwidth network, an
EFA figure for a type without EFA).
"""

from __future__ import annotations

from typing import Any

# Reference §3.1, plus the two conventions above.
SOURCES: dict[str, str] = {
    "A": 'AWS EC2 "Accelerated computing" instance specifications, '
         "https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html (GPU memory is usable GiB)",
    "S": "SkyPilot catalog, skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv at commit "
         "00148f2af3672e2229b4f7bf8157d5a3f36e3c35 (a scrape of the AWS price list; on-demand Linux "
         "$/h, us-east-1 unless noted; re-pull from the AWS Price List API before use)",
    "launch": "2026 launch coverage of the P6 instances (P6-B200 / P6-B300)",
    "3p": "third-party news or summaries; plausible, not checked against a primary source",
    "?": "not found or unverified in the reference",
    "derived": "computed here from a referenced figure (GiB × 1024); not itself in the reference",
    "n/a": "does not apply to this type",
}

REFERENCE = "shared/reference/mps-and-gpu-health.md §3 (GPU instance catalog (AWS) for capacity planning)"

# Markers that do not make a figure confirmed on their own (reference §3.1 / §3.3).
UNCONFIRMED_MARKERS = frozenset({"launch", "3p", "?", "derived"})

# Per-GPU memory in MiB: reference §3.2 notes, "GPU memory in MiB from the SkyPilot catalog, for MPS
# pinned-limit arithmetic". H100 and A100 are not in that list: derived from the [A] GiB figure.
GPU_MEMORY_MIB: dict[str, tuple[int, str]] = {
    "B300": (275_040, "S"),
    "B200": (183_359, "S"),
    "H200": (144_384, "S"),
    "L40S": (45_776, "S"),
    "A10G": (22_888, "S"),
    "L4": (22_888, "S"),
    "H100": (80 * 1024, "derived"),
    "A100 40 GB": (40 * 1024, "derived"),
    "A100 80 GB": (80 * 1024, "derived"),
}

# CPUs, reference §3.2 notes: "CPUs [A]: AMD EPYC 7R13 (g6, g6e, p5), EPYC 7R32 (g5), Intel Xeon
# 8275CL (p4d/p4de), Sapphire Rapids (p5en), Emerald Rapids, i.e. 5th-gen Xeon (p6-b200, p6-b300)."
_EPYC_7R13 = ("AMD EPYC 7R13", "A")
_EPYC_7R32 = ("AMD EPYC 7R32", "A")
_XEON_8275CL = ("Intel Xeon 8275CL", "A")
_SAPPHIRE = ("Intel Sapphire Rapids", "A")
_EMERALD = ("Intel Emerald Rapids (5th-gen Xeon)", "A")

_NONE = (None, "?")

# One entry per instance type, in the reference's order. Keys not given default to "not in the
# reference" (None, "?"). `network_gbps` is the headline figure; `network_burst` is True where the
# reference says "up to"; `ena_gbps` is a separate ENA figure where the headline figure is EFA.
TABLE: list[dict[str, Any]] = [
    dict(
        name="p6-b300.48xlarge",
        gpu_model=("B300", "A, launch"), gpu_count=(8, "A, launch"),
        gpu_memory_gib=(268, "A"), gpu_total_memory_gib=(2148, "A"),
        vcpus=(192, "A"), memory_gib=(4096, "A"), cpu=_EMERALD,
        network_gbps=(6400, "A"), ena_gbps=(300, "launch, 3p"),
        efa=(True, "A, launch"), efa_gbps=(6400, "A"), efa_version=("EFAv4", "A, launch"),
        network_cards=(17, "A"),
        on_demand_usd_per_hour=(142.416, "S"), price_region="us-west-2",
        regions=("US West (Oregon) [S, 3p]; AWS GovCloud (US-East) per the April 2026 What's New post "
                 "https://aws.amazon.com/about-aws/whats-new/2026/04/ec2-p6-b300-govcloud-us-east/ "
                 "[3p summary]", "S, 3p"),
        notes=(
            'GPU is "Blackwell Ultra" [A, launch].',
            "Not offered in us-east-1; the on-demand price is for us-west-2 [S]. Spot seen at $33.43 "
            "(usw2-az2) [S]; do not hard-code spot prices.",
            "68 ENIs, 8×3,800 GB NVMe, Nitro v6 [A].",
            'Launch claims: "2.1 TB" GPU memory (consistent: 2,148 GiB [A]); "4 TB" system memory '
            '(confirmed: 4,096 GiB [A]); "6.4 Tb/s EFA" (confirmed: 6,400 Gbps [A]); "300 Gbps ENA" '
            "(third-party restatement only).",
            "vs P6-B200: 2× networking and 1.5× GPU memory match [A]; 1.5× FP4 TFLOPS not checked "
            "[unverified].",
            'A Vantage-derived third-party dataset lists "192 GB per GPU" for B300: wrong, AWS says '
            "268 GiB. Do not trust that dataset for B300.",
        ),
    ),
    dict(
        name="p6-b200.48xlarge",
        gpu_model=("B200", "A, launch"), gpu_count=(8, "A, launch"),
        gpu_memory_gib=(179, "A"), gpu_total_memory_gib=(1432, "A"),
        vcpus=(192, "A"), memory_gib=(2048, "A"), cpu=_EMERALD,
        network_gbps=(3200, "A, launch"), ena_gbps=(150, "3p"),
        efa=(True, "A, launch"), efa_gbps=(3200, "A, launch"), efa_version=("EFAv4", "A, launch"),
        network_cards=(8, "A"),
        on_demand_usd_per_hour=(113.9328, "S"),
        regions=("us-east-1 (including the Atlanta Local Zone), us-east-2, us-west-2", "S"),
        notes=(
            "GA May 2025 [3p].",
            "8×3,800 GB NVMe, Nitro v6 [A].",
            "Spot about $13–28 [S]; do not hard-code spot prices.",
            'Launch claims: 8 Blackwell GPUs (confirmed [A]); "1,440 GB" GPU memory (consistent: '
            "8×179 GiB = 1,432 GiB usable; 1,440 GB is 8×180 GB marketing); 5th-gen Xeon (confirmed: "
            "Emerald Rapids); up to 3.2 Tb/s EFAv4 (confirmed: 3,200 Gbps [A]).",
            "~60% more GPU memory bandwidth than P5en: not confirmed (B200 HBM3e ~8 TB/s vs H200 "
            "~4.8 TB/s is about 1.67×) [unverified].",
        ),
    ),
    dict(
        name="p5en.48xlarge",
        gpu_model=("H200", "A"), gpu_count=(8, "A"),
        gpu_memory_gib=(141, "A"), gpu_total_memory_gib=(1128, "A"),
        vcpus=(192, "A"), memory_gib=(2048, "A"), cpu=_SAPPHIRE,
        network_gbps=(3200, "A"), efa=(True, "A"), network_cards=(16, "A"),
        on_demand_usd_per_hour=(63.296, "S"), regions=("many", "S"),
        notes=("Nitro v5 [A].",),
    ),
    dict(
        name="p5.48xlarge",
        gpu_model=("H100", "A"), gpu_count=(8, "A"),
        gpu_memory_gib=(80, "A"), gpu_total_memory_gib=(640, "A"),
        vcpus=(192, "A"), memory_gib=(2048, "A"), cpu=_EPYC_7R13,
        network_gbps=(3200, "A"), efa=(True, "A"), network_cards=(32, "A"),
        on_demand_usd_per_hour=(55.04, "S"), regions=("many", "S"),
        notes=("Spot in us-east-1 about $17.6–55 [S]; do not hard-code spot prices.",),
    ),
    dict(
        name="p5.4xlarge",
        gpu_model=("H100", "A"), gpu_count=(1, "A"),
        gpu_memory_gib=(80, "A"), gpu_total_memory_gib=(80, "A"),
        vcpus=(16, "A"), memory_gib=(256, "A"), cpu=_EPYC_7R13,
        network_gbps=(100, "A"), efa=_NONE,
    ),
    dict(
        name="p4d.24xlarge",
        gpu_model=("A100 40 GB", "A"), gpu_count=(8, "A"),
        gpu_memory_gib=(40, "A"), gpu_total_memory_gib=(320, "A"),
        vcpus=(96, "A"), memory_gib=(1152, "A"), cpu=_XEON_8275CL,
        network_gbps=(400, "A"), network_detail=("4×100", "A"), efa=(True, "A"),
        on_demand_usd_per_hour=(21.957642, "S"), regions=("many", "S"),
        notes=("8×1,000 GB NVMe [A].",),
    ),
    dict(
        name="p4de.24xlarge",
        gpu_model=("A100 80 GB", "A"), gpu_count=(8, "A"),
        gpu_memory_gib=(80, "A"), gpu_total_memory_gib=(640, "A"),
        vcpus=(96, "A"), memory_gib=(1152, "A"), cpu=_XEON_8275CL,
        network_gbps=(400, "A"), network_detail=("4×100", "A"), efa=(True, "A"),
        on_demand_usd_per_hour=(27.44705, "S"), regions=("limited", "S"),
    ),
]


def _g(name: str, model: str, count: int, per_gib: int, total_gib: int, vcpus: int, ram: int,
       net: float, burst: bool, baseline: float | None, efa: bool, price: float | None,
       cpu: tuple[str, str]) -> dict[str, Any]:
    """A g-family row of reference §3.2: every specification [A] (table note), the price [S]."""
    return dict(
        name=name,
        gpu_model=(model, "A"), gpu_count=(count, "A"),
        gpu_memory_gib=(per_gib, "A"), gpu_total_memory_gib=(total_gib, "A"),
        vcpus=(vcpus, "A"), memory_gib=(ram, "A"), cpu=cpu,
        network_gbps=(net, "A"), network_burst=burst,
        network_baseline_gbps=(baseline, "A") if baseline is not None else _NONE,
        efa=(efa, "A"),
        on_demand_usd_per_hour=(price, "S") if price is not None else _NONE,
    )


#                  name           GPU    n  GiB  total vCPU  RAM   Gbps  up-to  base   EFA    $/h (S)
TABLE += [
    _g("g6e.xlarge",   "L40S", 1, 44,  44,   4,   32,   20, True,  2.5,  False, 1.861,    _EPYC_7R13),
    _g("g6e.2xlarge",  "L40S", 1, 44,  44,   8,   64,   20, True,  5,    False, None,     _EPYC_7R13),
    _g("g6e.4xlarge",  "L40S", 1, 44,  44,  16,  128,   20, False, None, False, 3.00424,  _EPYC_7R13),
    _g("g6e.8xlarge",  "L40S", 1, 44,  44,  32,  256,   25, False, None, True,  4.52856,  _EPYC_7R13),
    _g("g6e.12xlarge", "L40S", 4, 44, 178,  48,  384,  100, False, None, True,  10.49264, _EPYC_7R13),
    _g("g6e.16xlarge", "L40S", 1, 44,  44,  64,  512,   35, False, None, True,  7.57719,  _EPYC_7R13),
    _g("g6e.24xlarge", "L40S", 4, 44, 178,  96,  768,  200, False, None, True,  None,     _EPYC_7R13),
    _g("g6e.48xlarge", "L40S", 8, 44, 357, 192, 1536,  400, False, None, True,  30.13118, _EPYC_7R13),
    _g("g5.xlarge",    "A10G", 1, 22,  22,   4,   16,   10, True,  None, False, 1.006,    _EPYC_7R32),
    _g("g5.4xlarge",   "A10G", 1, 22,  22,  16,   64,   25, True,  None, False, 1.624,    _EPYC_7R32),
    _g("g5.12xlarge",  "A10G", 4, 22,  89,  48,  192,   40, False, None, True,  None,     _EPYC_7R32),
    _g("g5.48xlarge",  "A10G", 8, 22, 178, 192,  768,  100, False, None, True,  16.288,   _EPYC_7R32),
    _g("g6.xlarge",    "L4",   1, 22,  22,   4,   16,   10, True,  None, False, 0.8048,   _EPYC_7R13),
    _g("g6.4xlarge",   "L4",   1, 22,  22,  16,   64,   25, True,  None, False, 1.3232,   _EPYC_7R13),
    _g("g6.12xlarge",  "L4",   4, 22,  89,  48,  192,   40, False, None, True,  None,     _EPYC_7R13),
    _g("g6.16xlarge",  "L4",   1, 22,  22,  64,  256,   25, False, None, False, 3.3968,   _EPYC_7R13),
    _g("g6.24xlarge",  "L4",   4, 22,  89,  96,  384,   50, False, None, False, 6.6752,   _EPYC_7R13),
    _g("g6.48xlarge",  "L4",   8, 22, 178, 192,  768,  100, False, None, True,  13.3504,  _EPYC_7R13),
]
