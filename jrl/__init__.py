"""jrl: verl's RL post-training (PPO, GRPO, ...) re-built in JAX/Flax.

Importing jrl (every entry point does, before JAX starts a backend) keeps libtpu's start-up errors
off a machine without a TPU. With libtpu installed (``jax[tpu]``), JAX's first device query and
``jrl.compile``'s slice descriptions start libtpu, which asks Cloud TPU's metadata for this host's
place in a slice; without a TPU JAX skips that query, and libtpu prints "Failed to find host bounds
for accelerator type" and "unexpected worker hostname ..." (log levels do not silence them).
`ONE_HOST` answers both; described slices stay the same. A machine where a PCI device could be a
TPU is left alone: on a TPU VM the metadata holds the answers, and forcing them would cut a
multi-host slice to one host.
"""

from __future__ import annotations

import os
from pathlib import Path

__version__ = "0.1.0"

PCI_DEVICES = Path("/sys/bus/pci/devices")
GOOGLE_VENDOR = "0x1ae0"
GVNIC_DEVICE = "0x0042"  # Compute Engine's virtual NIC: Google's vendor id on CPU VMs too
ONE_HOST = {"TPU_HOST_BOUNDS": "1,1,1", "TPU_WORKER_HOSTNAMES": "localhost"}


def may_hold_tpu(pci_devices: Path = PCI_DEVICES) -> bool:
    """Whether a PCI device here could be a TPU: any of Google's but its virtual NIC. (JAX counts
    TPU chips by Google's device ids; this test keeps no such list, so a TPU generation newer than
    jrl counts as a TPU too.)"""
    for vendor in pci_devices.glob("*/vendor"):
        device = vendor.with_name("device")
        if vendor.read_text().strip() == GOOGLE_VENDOR and (
            not device.exists() or device.read_text().strip() != GVNIC_DEVICE
        ):
            return True
    return False


def quiet_libtpu(pci_devices: Path = PCI_DEVICES) -> None:
    """Names this machine a one-host slice for libtpu (`ONE_HOST`, each variable unless already
    set) when no PCI device here could be a TPU."""
    if may_hold_tpu(pci_devices):
        return
    for name, value in ONE_HOST.items():
        os.environ.setdefault(name, value)


quiet_libtpu()
