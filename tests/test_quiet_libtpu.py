"""A machine without a TPU starts jrl without libtpu's start-up errors (jrl/__init__.py), both
where JAX tries its TPU backend and where jrl describes a TPU slice; a machine that may hold a TPU
keeps libtpu's own discovery."""

import os
import subprocess
import sys

import pytest

from jrl import ONE_HOST, may_hold_tpu, quiet_libtpu
from jrl.parallel.topology import libtpu_missing

LIBTPU_NOISE = ("Failed to find host bounds", "unexpected worker hostname", "Source Location Trace")


def pci_tree(root, *devices):
    """A /sys/bus/pci/devices folder holding `devices`, each (vendor id, device id)."""
    for index, (vendor, device) in enumerate(devices):
        folder = root / f"0000:00:{index:02x}.0"
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(vendor + "\n")
        (folder / "device").write_text(device + "\n")
    return root


@pytest.mark.parametrize(
    ("devices", "tpu"),
    [
        ([], False),
        ([("0x8086", "0x1237"), ("0x1af4", "0x1000")], False),  # a plain VM
        ([("0x1ae0", "0x0042")], False),  # Compute Engine's virtual NIC
        ([("0x1ae0", "0x0042"), ("0x1ae0", "0x0063")], True),  # a TPU v5e VM
        ([("0x1ae0", "0x0fff")], True),  # a Google device jrl does not know: maybe a TPU
    ],
)
def test_only_a_machine_without_a_google_accelerator_is_named_one_host(
    tmp_path, monkeypatch, devices, tpu
):
    for name in ONE_HOST:
        monkeypatch.delenv(name, raising=False)
    root = pci_tree(tmp_path / "pci", *devices)
    assert may_hold_tpu(root) is tpu
    quiet_libtpu(root)
    assert {name: os.environ.get(name) for name in ONE_HOST} == (
        dict.fromkeys(ONE_HOST) if tpu else ONE_HOST
    )


def test_a_value_already_set_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "worker-0,worker-1")
    monkeypatch.delenv("TPU_HOST_BOUNDS", raising=False)
    quiet_libtpu(pci_tree(tmp_path / "pci"))
    assert os.environ["TPU_WORKER_HOSTNAMES"] == "worker-0,worker-1"
    assert os.environ["TPU_HOST_BOUNDS"] == ONE_HOST["TPU_HOST_BOUNDS"]


def start(code_or_module: list[str]) -> subprocess.CompletedProcess:
    """Runs ``python ARGS`` as a fresh start on this machine: JAX picks its backends itself (no
    JAX_PLATFORMS), libtpu's variables unset, and libtpu past its lockfile even while another
    process holds it (else it stops before it prints)."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS" and k not in ONE_HOST}
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    return subprocess.run(
        [sys.executable, *code_or_module], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.skipif(
    libtpu_missing() is not None or may_hold_tpu(),
    reason="needs libtpu on a machine without a TPU",
)
def test_entry_points_start_without_libtpu_errors():
    bare = start(["-c", "import jax; jax.devices()"])  # JAX alone: libtpu complains here
    assert all(line in bare.stderr for line in LIBTPU_NOISE), bare.stderr
    for command in (
        ["-m", "jrl.train", "--config=configs/gsm8k_grpo.py:tiny", "--explain"],
        ["-c", "from jrl.parallel.topology import open_slice; open_slice('v5e:2x2')"],
    ):
        run = start(command)
        assert run.returncode == 0, run.stderr
        assert not [line for line in LIBTPU_NOISE if line in run.stderr], run.stderr
