"""GPU backends: the fake one end to end, and NVML's absence handled where there is no driver."""

import json
import threading
import time

import pytest

from shoal.agent.gpu import detect
from shoal.agent.gpu.fake import FakeGpus, inject
from shoal.agent.gpu.nvml import driver_present


def test_a_spec_gives_its_devices_and_the_uuids_survive_a_restart(tmp_path):
    spec = tmp_path / "gpus.json"
    spec.write_text(json.dumps({"model": "NVIDIA H200", "count": 2, "memoryMiB": 143771}))
    first = detect(fake_spec=spec, state_dir=tmp_path / "state")
    devices = first.devices()
    first.close()
    assert [(g.index, g.model, g.memory_mib) for g in devices] == [(0, "NVIDIA H200", 143771), (1, "NVIDIA H200", 143771)]
    assert len({g.uuid for g in devices}) == 2 and all(g.uuid.startswith("GPU-") for g in devices)
    again = detect(fake_spec=spec, state_dir=tmp_path / "state")
    assert again.devices() == devices
    again.close()


def test_explicit_uuids_must_match_the_count(tmp_path):
    spec = tmp_path / "gpus.json"
    spec.write_text(json.dumps({"model": "m", "count": 2, "memoryMiB": 1, "uuids": ["GPU-a"]}))
    with pytest.raises(ValueError, match="2 GPUs but 1 uuids"):
        FakeGpus.from_spec(spec)


def test_an_injected_xid_wakes_the_waiter_at_once(tmp_path):
    spec = tmp_path / "gpus.json"
    spec.write_text(json.dumps({"model": "m", "count": 2, "memoryMiB": 1024, "uuids": ["GPU-a", "GPU-b"]}))
    gpus = FakeGpus.from_spec(spec, state_dir=tmp_path)
    try:
        assert gpus.wait_xid(0.05) is None  # nothing injected: the wait times out
        got = []
        waiter = threading.Thread(target=lambda: got.append((gpus.wait_xid(10), time.monotonic())))
        waiter.start()
        time.sleep(0.1)
        sent = time.monotonic()
        inject(tmp_path, 1, 79)
        waiter.join(5)
        event, woke = got[0]
        assert (event.gpu_uuid, event.xid) == ("GPU-b", 79)
        assert woke - sent < 0.5  # woken by the datagram, not by a timer
        inject(tmp_path, "GPU-a", 48)
        assert gpus.wait_xid(1).gpu_uuid == "GPU-a"
    finally:
        gpus.close()


@pytest.mark.skipif(driver_present(), reason="an NVIDIA driver is present: tests/gpu covers NVML")
def test_without_a_driver_there_is_no_gpu_backend():
    assert detect() is None


def test_a_simulated_instance_type_has_the_catalogs_gpus(tmp_path):
    gpus = detect(instance_type="p6-b200.48xlarge", state_dir=tmp_path)
    try:
        devices = gpus.devices()
        assert len(devices) == 8
        assert {(g.model, g.memory_mib) for g in devices} == {("B200", 183359)}
    finally:
        gpus.close()
    assert detect(instance_type="p4d.24xlarge").devices()[0].memory_mib == 40960
