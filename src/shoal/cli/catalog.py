"""`shoal catalog …`: the GPU instance catalog, each figure with its source."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from shoal import catalog
from shoal.catalog import InstanceType

app = typer.Typer(no_args_is_help=True, help="AWS GPU instance types and their figures, with sources.")


def _num(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _network(t: InstanceType) -> str:
    if t.network_gbps is None:
        return "?"
    text = f"{'up to ' if t.network_burst else ''}{_num(t.network_gbps)} Gbps"
    if t.network_detail:
        text += f" ({t.network_detail})"
    if t.efa:
        text += ", EFA"
    return text


def _gpus(t: InstanceType) -> tuple[str, str]:
    if t.gpu is None:
        return "-", "-"
    each = f"{_num(t.gpu.memory_gib)} GiB" if t.gpu.memory_gib is not None else "?"
    return f"{t.gpu.count} × {t.gpu.model}", f"{each} ({_num(t.gpu.memory_mib)} MiB)"


@app.command("list")
def list_types(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON array of full records.")] = False,
) -> None:
    """List every instance type in the catalog."""
    types = catalog.all_types()
    if as_json:
        typer.echo(json.dumps([t.to_dict() for t in types], indent=2, ensure_ascii=False))
        return
    header = ("TYPE", "VCPUS", "MEMORY GIB", "GPUS", "GPU MEMORY EACH", "NETWORK")
    rows = [(t.name, _num(t.vcpus), _num(t.memory_gib), *_gpus(t), _network(t)) for t in types]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    right = {1, 2}
    for r in [header, *rows]:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        typer.echo("  ".join(cells).rstrip())
    typer.echo(f"\nSource: {catalog.REFERENCE}. `shoal catalog show TYPE` gives each figure's source.")


# (sources key, label, unit) in display order.
_FIELDS = [
    ("cpu", "CPU", ""),
    ("vcpus", "vCPUs", ""),
    ("memory_gib", "Memory", " GiB"),
    ("gpu.model", "GPU model", ""),
    ("gpu.count", "GPU count", ""),
    ("gpu.memory_gib", "GPU memory each", " GiB"),
    ("gpu.memory_mib", "GPU memory each", " MiB"),
    ("gpu.total_memory_gib", "GPU memory total", " GiB"),
    ("network_gbps", "Network", " Gbps"),
    ("network_baseline_gbps", "Network baseline", " Gbps"),
    ("network_detail", "Network detail", ""),
    ("ena_gbps", "ENA (separate)", " Gbps"),
    ("efa", "EFA", ""),
    ("efa_gbps", "EFA bandwidth", " Gbps"),
    ("efa_version", "EFA version", ""),
    ("network_cards", "Network cards", ""),
    ("on_demand_usd_per_hour", "On-demand $/h", ""),
    ("price_region", "Price region", ""),
    ("regions", "Regions noted", ""),
]


def _show_text(t: InstanceType) -> None:
    typer.echo(f"{t.name}  (family {t.family})")
    unconfirmed = set(t.unconfirmed_fields())
    used: list[str] = []
    width = max(len(label) for _, label, _ in _FIELDS)
    for key, label, unit in _FIELDS:
        value, src = t.value(key), t.sources.get(key, "?")
        if key == "network_detail" and value is None:
            continue
        if value is None:
            text = "n/a" if src == "n/a" else "not in the reference"
        elif key == "network_gbps" and t.network_burst:
            text = f"up to {_num(value)}{unit}"
        elif key == "on_demand_usd_per_hour":
            text = f"${value}"
        else:
            text = f"{_num(value)}{unit}"
        if src == "n/a":
            typer.echo(f"  {label:<{width}}  {text}")
            continue
        flag = "  (unconfirmed)" if key in unconfirmed else ""
        typer.echo(f"  {label:<{width}}  {text}  [{src}]{flag}")
        used += [m for m in catalog.markers(src) if m not in used]
    if t.notes:
        typer.echo("Notes:")
        for note in t.notes:
            typer.echo(f"  - {note}")
    typer.echo("Sources:")
    for m in used:
        typer.echo(f"  [{m}] {catalog.SOURCES.get(m, m)}")
    typer.echo(f"  All figures from {catalog.REFERENCE}.")


@app.command("show")
def show(
    name: Annotated[str, typer.Argument(metavar="TYPE", help="An instance type, e.g. p6-b200.48xlarge.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the full record as JSON.")] = False,
) -> None:
    """Show every figure of one instance type, with its source."""
    try:
        t = catalog.get(name)
    except catalog.UnknownInstanceType as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    if as_json:
        data = t.to_dict()
        data["source_markers"] = {m: catalog.SOURCES[m] for src in t.sources.values()
                                  for m in catalog.markers(src) if m in catalog.SOURCES}
        data["reference"] = catalog.REFERENCE
        typer.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    _show_text(t)
