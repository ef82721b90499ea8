"""The GPU instance catalog (shoal.catalog) and `shoal catalog …`.

Expected figures are those of shared/reference/mps-and-gpu-health.md §3. Where that file is
reachable (a checkout with `shared/` beside or inside the repository), the whole §3.2 table is also
parsed and compared with the catalog, markers included.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shoal import catalog
from shoal.catalog import GpuSpec, InstanceType
from shoal.cli.main import app

REQUIRED = [
    "p6-b300.48xlarge", "p6-b200.48xlarge", "p5en.48xlarge", "p5.48xlarge", "p4d.24xlarge", "p4de.24xlarge",
    *(f"g6e.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge",
                           "48xlarge")),
    *(f"g5.{s}" for s in ("xlarge", "4xlarge", "12xlarge", "48xlarge")),
    *(f"g6.{s}" for s in ("xlarge", "4xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge")),
]

# name: (model, count, GiB per GPU, GiB total, MiB per GPU, vCPUs, RAM GiB, network Gbps, EFA), per §3.2.
EXPECTED = {
    "p6-b300.48xlarge": ("B300", 8, 268, 2148, 275_040, 192, 4096, 6400, True),
    "p6-b200.48xlarge": ("B200", 8, 179, 1432, 183_359, 192, 2048, 3200, True),
    "p5en.48xlarge": ("H200", 8, 141, 1128, 144_384, 192, 2048, 3200, True),
    "p5.48xlarge": ("H100", 8, 80, 640, 80 * 1024, 192, 2048, 3200, True),
    "p4d.24xlarge": ("A100 40 GB", 8, 40, 320, 40 * 1024, 96, 1152, 400, True),
    "p4de.24xlarge": ("A100 80 GB", 8, 80, 640, 80 * 1024, 96, 1152, 400, True),
    "g6e.xlarge": ("L40S", 1, 44, 44, 45_776, 4, 32, 20, False),
    "g6e.12xlarge": ("L40S", 4, 44, 178, 45_776, 48, 384, 100, True),
    "g6e.48xlarge": ("L40S", 8, 44, 357, 45_776, 192, 1536, 400, True),
    "g5.xlarge": ("A10G", 1, 22, 22, 22_888, 4, 16, 10, False),
    "g5.48xlarge": ("A10G", 8, 22, 178, 22_888, 192, 768, 100, True),
    "g6.24xlarge": ("L4", 4, 22, 89, 22_888, 96, 384, 50, False),
    "g6.48xlarge": ("L4", 8, 22, 178, 22_888, 192, 768, 100, True),
}

runner = CliRunner()


def test_every_required_type_is_present():
    names = catalog.names()
    assert [n for n in REQUIRED if n not in names] == []
    assert len(names) == len(set(names))
    assert all(isinstance(t, InstanceType) for t in catalog.all_types())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_figures_match_the_reference(name):
    model, count, gib, total, mib, vcpus, ram, net, efa = EXPECTED[name]
    t = catalog.get(name)
    assert t.gpu == GpuSpec(model=model, count=count, memory_mib=mib, memory_gib=gib, total_memory_gib=total)
    assert (t.vcpus, t.memory_gib, t.network_gbps, t.efa) == (vcpus, ram, net, efa)
    assert t.family == name.split(".")[0]


def test_p6_b200_has_eight_b200s_and_its_launch_claims():
    t = catalog.get("p6-b200.48xlarge")
    assert (t.gpu.count, t.gpu.model, t.gpu.memory_mib) == (8, "B200", 183_359)
    assert t.gpu.total_memory_mib == 8 * 183_359
    assert t.sources["gpu.count"] == "A, launch"
    assert (t.efa_gbps, t.efa_version, t.sources["efa_gbps"]) == (3200, "EFAv4", "A, launch")
    # ENA "150 Gbps" is third-party only: kept, but marked unconfirmed.
    assert (t.ena_gbps, t.sources["ena_gbps"]) == (150, "3p")
    assert "ena_gbps" in t.unconfirmed_fields()
    assert t.on_demand_usd_per_hour == 113.9328 and t.price_region == "us-east-1"


def test_p6_b300_price_is_for_us_west_2_and_ena_is_unconfirmed():
    t = catalog.get("p6-b300.48xlarge")
    assert (t.on_demand_usd_per_hour, t.price_region, t.sources["on_demand_usd_per_hour"]) == (142.416, "us-west-2", "S")
    assert (t.ena_gbps, t.sources["ena_gbps"]) == (300, "launch, 3p")
    assert t.unconfirmed_fields() == ["ena_gbps"]
    assert (t.efa_gbps, t.network_cards) == (6400, 17)


def test_gpu_mib_comes_from_the_reference_or_is_marked_derived():
    for t in catalog.all_types():
        src = t.sources["gpu.memory_mib"]
        if t.gpu.model in ("H100", "A100 40 GB", "A100 80 GB"):
            # The reference gives these only in GiB [A]; the MiB figure is GiB × 1024, flagged.
            assert src == "derived" and t.gpu.memory_mib == t.gpu.memory_gib * 1024
            assert "gpu.memory_mib" in t.unconfirmed_fields()
        else:
            assert src == "S"


def test_burstable_network_and_gaps():
    g6e = catalog.get("g6e.xlarge")
    assert (g6e.network_burst, g6e.network_gbps, g6e.network_baseline_gbps) == (True, 20, 2.5)
    g5 = catalog.get("g5.xlarge")  # "up to 10", no baseline in the reference
    assert (g5.network_burst, g5.network_baseline_gbps, g5.sources["network_baseline_gbps"]) == (True, None, "?")
    assert catalog.get("g6e.4xlarge").network_burst is False
    assert catalog.get("p4d.24xlarge").network_detail == "4×100"
    p5small = catalog.get("p5.4xlarge")  # EFA and price are "?" in the reference
    assert p5small.efa is None and p5small.on_demand_usd_per_hour is None
    assert {"efa", "on_demand_usd_per_hour"} <= set(p5small.missing_fields())
    assert catalog.get("g6e.2xlarge").on_demand_usd_per_hour is None


def _figures(t: InstanceType) -> dict[str, object]:
    out = {f.name: getattr(t, f.name) for f in dataclasses.fields(t)
           if f.name not in ("name", "family", "gpu", "sources", "notes", "network_burst")}
    if t.gpu is not None:
        out.update({f"gpu.{f.name}": getattr(t.gpu, f.name) for f in dataclasses.fields(t.gpu)})
    return out


@pytest.mark.parametrize("name", catalog.names())
def test_every_figure_has_a_source(name):
    t = catalog.get(name)
    figures = _figures(t)
    assert set(t.sources) == set(figures)
    for key, value in figures.items():
        marks = catalog.markers(t.sources[key])
        assert marks and all(m in catalog.SOURCES for m in marks), (key, t.sources[key])
        if value is None:
            assert t.sources[key] in ("?", "n/a"), key
        else:
            assert "?" not in marks and "n/a" not in marks, key
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert t.sources[key] not in ("?", "n/a"), key


def test_records_are_frozen_and_serialisable():
    t = catalog.get("g6.xlarge")
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.vcpus = 8  # type: ignore[misc]
    data = json.loads(json.dumps([x.to_dict() for x in catalog.all_types()]))
    assert data[0]["name"] == "p6-b300.48xlarge" and data[0]["gpu"]["count"] == 8


def test_get_normalises_and_unknown_names_suggest_close_matches():
    assert catalog.get("  P6-B200.48XLARGE ").name == "p6-b200.48xlarge"
    with pytest.raises(KeyError) as err:
        catalog.get("p6-b200.48xl")
    assert "p6-b200.48xlarge" in str(err.value)
    assert catalog.close_matches("p6-b200")[0] == "p6-b200.48xlarge"
    assert catalog.close_matches("g6e.")[:2] == ["g6e.xlarge", "g6e.2xlarge"]
    with pytest.raises(KeyError) as err:
        catalog.get("nonesuch")
    assert "did you mean" not in str(err.value)


# --- the CLI -----------------------------------------------------------------------------------


def test_cli_list_table():
    result = runner.invoke(app, ["catalog", "list"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["TYPE", "VCPUS", "MEMORY"]
    for name in REQUIRED:
        assert any(line.startswith(name + " ") for line in lines), name
    row = next(line for line in lines if line.startswith("p6-b200.48xlarge "))
    assert "8 × B200" in row and "179 GiB" in row and "183,359 MiB" in row and "3,200 Gbps" in row
    g5 = next(line for line in lines if line.startswith("g5.xlarge "))
    assert "up to 10 Gbps" in g5


def test_cli_list_json():
    result = runner.invoke(app, ["catalog", "list", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [d["name"] for d in data] == catalog.names()
    b200 = next(d for d in data if d["name"] == "p6-b200.48xlarge")
    assert b200["gpu"] == {"model": "B200", "count": 8, "memory_mib": 183_359, "memory_gib": 179,
                           "total_memory_gib": 1432, "total_memory_mib": 8 * 183_359}
    assert b200["sources"]["vcpus"] == "A"


def test_cli_show_prints_every_field_with_its_source():
    result = runner.invoke(app, ["catalog", "show", "p6-b300.48xlarge"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "GPU count" in out and "8  [A, launch]" in out
    assert "268 GiB  [A]" in out and "275,040 MiB  [S]" in out
    assert "300 Gbps  [launch, 3p]  (unconfirmed)" in out
    assert "$142.416  [S]" in out and "us-west-2" in out
    assert "https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html" in out
    assert "skypilot" in out.lower()


def test_cli_show_says_what_the_reference_lacks():
    result = runner.invoke(app, ["catalog", "show", "g6e.24xlarge"])
    assert result.exit_code == 0, result.output
    price = next(line for line in result.stdout.splitlines() if "On-demand" in line)
    assert "not in the reference" in price
    result = runner.invoke(app, ["catalog", "show", "p5.48xlarge"])
    mib = next(line for line in result.stdout.splitlines() if "MiB" in line)
    assert "81,920 MiB  [derived]  (unconfirmed)" in mib


def test_cli_show_json():
    result = runner.invoke(app, ["catalog", "show", "g6e.xlarge", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["name"] == "g6e.xlarge" and data["network_baseline_gbps"] == 2.5
    assert data["sources"]["on_demand_usd_per_hour"] == "S"
    assert set(data["source_markers"]) == {"A", "S", "?", "n/a"}
    assert "ena_gbps" in data["missing"]


def test_cli_show_unknown_type_exits_1_with_suggestions():
    result = runner.invoke(app, ["catalog", "show", "p5.48xlarg"])
    assert result.exit_code == 1
    assert "unknown instance type" in result.stderr
    assert "p5.48xlarge" in result.stderr
    assert result.stdout == ""


# --- cross-check with the reference file itself ------------------------------------------------

def _reference() -> Path | None:
    root = Path(__file__).resolve().parents[2]
    for candidate in (root / "shared", root.parent / "shared"):
        path = candidate / "reference" / "mps-and-gpu-health.md"
        if path.is_file():
            return path
    return None


def _table_rows() -> dict[str, list[str]]:
    path = _reference()
    if path is None:
        return {}
    text = path.read_text(encoding="utf-8")
    section = text[text.index("### 3.2 Table"):text.index("### 3.3")]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 9 and re.match(r"^[gp][0-9]", cells[0]):
            rows[cells[0]] = cells
    return rows


ROWS = _table_rows()


def _first(cell: str) -> tuple[str, str]:
    """The first ';'-part of a cell, without its markers, and its markers (A when unmarked: the
    reference's table note says all g-family figures come from [A])."""
    part = cell.split(";")[0]
    found = re.findall(r"\[([^\]]+)\]", part)
    return re.sub(r"\[[^\]]+\]", "", part).strip(), (found[0] if found else "A")


def _nums(text: str) -> list[float]:
    return [float(n.replace(",", "")) for n in re.findall(r"\d[\d,]*(?:\.\d+)?", text)]


@pytest.mark.skipif(not ROWS, reason="shared/reference/mps-and-gpu-health.md not reachable from this checkout")
def test_reference_table_rows_are_all_in_the_catalog():
    assert sorted(ROWS) == sorted(catalog.names())


@pytest.mark.skipif(not ROWS, reason="shared/reference/mps-and-gpu-health.md not reachable from this checkout")
@pytest.mark.parametrize("name", sorted(ROWS) or ["-"])
def test_catalog_matches_reference_table_row(name):
    _, gpu, mem, vcpu, ram, net, efa, price, _regions = ROWS[name]
    t = catalog.get(name)

    text, marks = _first(gpu)
    assert int(re.search(r"\((\d+)\)", text).group(1)) == t.gpu.count
    assert text.startswith(t.gpu.model)
    assert t.sources["gpu.count"] == t.sources["gpu.model"] == marks

    text, marks = _first(mem)
    figures = _nums(text)
    assert figures[0] == t.gpu.memory_gib
    assert (figures[1] if "/" in text else figures[0]) == t.gpu.total_memory_gib
    assert t.sources["gpu.memory_gib"] == t.sources["gpu.total_memory_gib"] == marks

    for cell, value, key in ((vcpu, t.vcpus, "vcpus"), (ram, t.memory_gib, "memory_gib")):
        text, marks = _first(cell)
        assert _nums(text)[0] == value and t.sources[key] == marks

    text, marks = _first(net)
    assert _nums(text)[0] == t.network_gbps and t.sources["network_gbps"] == marks
    assert t.network_burst == text.startswith("up to")
    if "baseline" in text:
        assert _nums(text)[1] == t.network_baseline_gbps

    text, marks = _first(efa)
    expected = {"yes": True, "no": False, "?": None}[text.split()[0]]
    assert t.efa is expected
    assert t.sources["efa"] == ("?" if expected is None else marks)

    figures = _nums(re.sub(r"us-(east|west)-\d", "", price))
    if price.strip() in ("?", ""):
        assert t.on_demand_usd_per_hour is None
    else:
        assert figures[-1] == t.on_demand_usd_per_hour and t.sources["on_demand_usd_per_hour"] == "S"
