"""What this machine offers: accelerators (CUDA through torch or NVML), CPU cores, RAM, free disk.

torch is imported only when a GPU driver is present (importing it costs seconds and hundreds of MB
in every node process); a node without torch or without a GPU advertises its CPU.
"""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

import psutil

from intellect_node.protocol.messages import Hardware

_GPU_DRIVER_FILES = ("/dev/nvidiactl", "/proc/driver/nvidia/version")


def _cuda() -> tuple[str, int, int] | None:
    """(name, count, memory per device) of CUDA devices, or None."""
    if not any(Path(path).exists() for path in _GPU_DRIVER_FILES):
        return None
    try:
        import torch

        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            props = torch.cuda.get_device_properties(0)
            return props.name, count, int(props.total_memory)
    except ImportError:
        pass
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        if count:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            return (name.decode() if isinstance(name, bytes) else name), count, int(memory)
    except Exception:  # NVML absent or broken: treat as no GPU, the CPU fallback is correct
        pass
    return None


def detect_hardware(data_dir: Path) -> Hardware:
    cuda = _cuda()
    disk_root = data_dir if data_dir.exists() else Path(os.getcwd())
    common = dict(
        cpu_cores=os.cpu_count() or 1,
        ram_bytes=int(psutil.virtual_memory().total),
        disk_free_bytes=int(shutil.disk_usage(disk_root).free),
    )
    if cuda is not None:
        name, count, memory = cuda
        return Hardware(accelerator="cuda", accelerator_name=name[:128], accelerator_count=count,
                        accelerator_memory_bytes=memory, **common)
    return Hardware(accelerator="cpu", accelerator_name=(platform.processor() or platform.machine())[:128],
                    accelerator_count=0, accelerator_memory_bytes=0, **common)
