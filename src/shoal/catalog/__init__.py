"""The instance catalog: AWS GPU instance types and what they carry, each figure with its source.

The data is in `shoal.catalog.instances` (one entry per type, taken from
`shared/reference/mps-and-gpu-health.md` §3). This module turns it into frozen `InstanceType`
records and looks them up::

    >>> from shoal import catalog
    >>> t = catalog.get("p6-b200.48xlarge")
    >>> t.gpu.count, t.gpu.model, t.sources["gpu.count"]
    (8, 'B200', 'A, launch')

`sources` maps each field (GPU fields as ``gpu.<name>``) to the reference's markers, explained in
`SOURCES`. A figure the reference lacks is None with the marker ``?``; ``n/a`` marks a figure that
does not apply to the type.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field
from typing import Any

from shoal.catalog.instances import GPU_MEMORY_MIB, REFERENCE, SOURCES, TABLE, UNCONFIRMED_MARKERS

__all__ = ["GpuSpec", "InstanceType", "UnknownInstanceType", "SOURCES", "REFERENCE", "get",
           "all_types", "names", "close_matches", "markers"]


@dataclass(frozen=True)
class GpuSpec:
    model: str
    count: int
    memory_mib: int                          # per GPU
    memory_gib: float | None = None          # per GPU, usable GiB as AWS lists it
    total_memory_gib: float | None = None    # all GPUs, as AWS lists it (not always count × memory_gib)

    @property
    def total_memory_mib(self) -> int:
        return self.count * self.memory_mib


@dataclass(frozen=True)
class InstanceType:
    name: str
    family: str
    vcpus: int
    memory_gib: float
    gpu: GpuSpec | None
    network_gbps: float | None               # headline figure (EFA bandwidth where the reference says so)
    efa: bool | None                         # None: not in the reference
    sources: dict[str, str] = field(hash=False)
    notes: tuple[str, ...] = ()
    network_burst: bool = False              # "up to" network_gbps
    network_baseline_gbps: float | None = None
    network_detail: str | None = None        # e.g. "4×100"
    ena_gbps: float | None = None            # a separate ENA figure, where the headline one is EFA
    efa_gbps: float | None = None
    efa_version: str | None = None
    network_cards: int | None = None
    cpu: str | None = None
    on_demand_usd_per_hour: float | None = None
    price_region: str | None = None
    regions: str | None = None

    def value(self, key: str) -> Any:
        """The value of a `sources` key: a field name, or ``gpu.<field>``."""
        if key.startswith("gpu."):
            return None if self.gpu is None else getattr(self.gpu, key[4:])
        return getattr(self, key)

    def missing_fields(self) -> list[str]:
        """Fields the reference has no figure for."""
        return [k for k, src in self.sources.items() if src == "?" and self.value(k) is None]

    def unconfirmed_fields(self) -> list[str]:
        """Fields with a value whose only sources are launch claims, third parties or arithmetic."""
        return [k for k, src in self.sources.items()
                if self.value(k) is not None and set(markers(src)) <= UNCONFIRMED_MARKERS]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["notes"] = list(self.notes)
        if self.gpu is not None:
            data["gpu"]["total_memory_mib"] = self.gpu.total_memory_mib
        data["missing"] = self.missing_fields()
        data["unconfirmed"] = self.unconfirmed_fields()
        return data


class UnknownInstanceType(KeyError):
    def __init__(self, name: str, suggestions: list[str]):
        super().__init__(name)
        self.name, self.suggestions = name, suggestions

    def __str__(self) -> str:
        hint = f"; did you mean {', '.join(self.suggestions)}?" if self.suggestions else ""
        return (f"unknown instance type {self.name!r}{hint} "
                f"(the catalog has {len(_BY_NAME)} types; see `shoal catalog list`)")


def markers(source: str) -> list[str]:
    """The markers in a `sources` value, e.g. ``"A, launch"`` -> ``["A", "launch"]``."""
    return [m.strip() for m in source.split(",") if m.strip()]


_NA = (None, "n/a")
_MISSING = (None, "?")


def _build(row: dict[str, Any]) -> InstanceType:
    row = dict(row)
    name = row.pop("name")
    sources: dict[str, str] = {}

    def take(key: str, default: tuple[Any, str] | None = None, source_key: str | None = None) -> Any:
        value, src = row.pop(key, default if default is not None else _MISSING)
        sources[source_key or key] = src
        return value

    model = take("gpu_model", source_key="gpu.model")
    count = take("gpu_count", source_key="gpu.count")
    per_gib = take("gpu_memory_gib", source_key="gpu.memory_gib")
    total_gib = take("gpu_total_memory_gib", source_key="gpu.total_memory_gib")
    gpu = None
    if model is not None:
        mib, sources["gpu.memory_mib"] = GPU_MEMORY_MIB[model]
        gpu = GpuSpec(model=model, count=count, memory_mib=mib, memory_gib=per_gib, total_memory_gib=total_gib)

    burst = row.pop("network_burst", False)
    efa = take("efa")
    fields: dict[str, Any] = dict(
        vcpus=take("vcpus"),
        memory_gib=float(take("memory_gib")),
        network_gbps=take("network_gbps"),
        network_baseline_gbps=take("network_baseline_gbps", None if burst else _NA),
        network_detail=take("network_detail", _NA),
        ena_gbps=take("ena_gbps"),
        efa_gbps=take("efa_gbps", _NA if efa is False else None),
        efa_version=take("efa_version", _NA if efa is False else None),
        network_cards=take("network_cards"),
        cpu=take("cpu"),
        on_demand_usd_per_hour=take("on_demand_usd_per_hour"),
        regions=take("regions"),
    )
    price_region = row.pop("price_region", "us-east-1")
    if fields["on_demand_usd_per_hour"] is not None:
        sources["price_region"] = sources["on_demand_usd_per_hour"]
    else:
        price_region, sources["price_region"] = None, "?"
    notes = tuple(row.pop("notes", ()))
    if row:
        raise ValueError(f"catalog entry {name}: unknown keys {sorted(row)}")
    return InstanceType(name=name, family=name.split(".")[0], gpu=gpu, efa=efa, network_burst=burst,
                        price_region=price_region, notes=notes, sources=sources, **fields)


_BY_NAME: dict[str, InstanceType] = {}
for _row in TABLE:
    _t = _build(_row)
    if _t.name in _BY_NAME:
        raise ValueError(f"catalog entry {_t.name} appears twice")
    _BY_NAME[_t.name] = _t
del _row, _t


def names() -> list[str]:
    return list(_BY_NAME)


def all_types() -> list[InstanceType]:
    """Every type, in the reference's order (P6, P5, P4, then g6e, g5, g6)."""
    return list(_BY_NAME.values())


def close_matches(name: str, n: int = 5) -> list[str]:
    """Known type names close to `name`: same-prefix names first, then difflib's."""
    key = name.strip().lower()
    found = [t for t in _BY_NAME if key and t.startswith(key)]
    found += [t for t in difflib.get_close_matches(key, list(_BY_NAME), n=n, cutoff=0.6) if t not in found]
    return found[:n]


def get(name: str) -> InstanceType:
    """The type called `name` (case and surrounding space ignored); `UnknownInstanceType`, a
    `KeyError` whose message lists close matches, when there is none."""
    try:
        return _BY_NAME[name.strip().lower()]
    except KeyError:
        raise UnknownInstanceType(name, close_matches(name)) from None
