"""The TPU chips attached to this machine, as its device files show them (no TensorFlow, no libtpu)."""

from __future__ import annotations

import glob


def tpu_device_files() -> list[str]:
    """The TPU chips' device files: /dev/accel* or /dev/vfio/<n>, by generation; [] off a TPU VM."""
    return sorted(glob.glob("/dev/accel*") + glob.glob("/dev/vfio/[0-9]*"))
