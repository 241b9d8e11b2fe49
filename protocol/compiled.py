"""A pure torch function run compiled (``torch.compile``) on the devices where that pays, eager elsewhere.

Why: the sampling race (``protocol.sampling``) hashes a noise value for every token of the
vocabulary at every position, about twenty-five elementwise passes over a [rows, vocabulary]
int64/float64 tensor when run eagerly. On a GPU each pass is a round trip through memory (an H200
replayed 38,580 positions per second, the verifier's whole cost); compiled, the passes fuse into one
kernel that reads the logits once. On a CPU the fused loop is about 3x faster too, but compiling
costs seconds of C++ compiler per process and shape family, so CPUs stay eager unless asked.

Compiling is an optimisation, never a requirement: a machine without a working compiler (no
``triton``, no C++ toolchain) or a function the compiler rejects falls back to the eager function
with one warning, and stays there for the life of the process. The compiled result equals the
eager one except where the two float64 logarithms of the noise round differently (an ulp,
specs/sampling.md section 2).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection
from typing import Any

import torch

log = logging.getLogger(__name__)

GPU_DEVICES = frozenset({"cuda"})


class CompiledOn:
    """``fn`` compiled for tensors on ``devices`` (device types, e.g. ``{"cuda"}``), eager elsewhere.
    Call as ``wrapper(device, *args)``: the caller names the device its tensors are on."""

    def __init__(self, fn: Callable[..., Any], devices: Collection[str] = GPU_DEVICES) -> None:
        self.fn = fn
        self.devices = frozenset(devices)
        self._compiled: Callable[..., Any] | None = None
        self._lock = threading.Lock()  # one compile, even when several roles' threads call at once
        self.failed: str | None = None  # why compiling failed; then eager for good

    def __call__(self, device: torch.device, *args: Any) -> Any:
        if device.type not in self.devices or self.failed is not None:
            return self.fn(*args)
        try:
            if self._compiled is None:
                with self._lock:  # the first call compiles, once, even when several roles' threads call
                    if self._compiled is None:
                        compiled = torch.compile(self.fn, dynamic=True)
                        result = compiled(*args)
                        self._compiled = compiled
                        return result
            return self._compiled(*args)
        except Exception as exc:  # noqa: BLE001 - whatever the compiler raised, the eager function decides
            result = self.fn(*args)  # raises too when the inputs, not the compiler, were wrong
            self.failed = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            log.warning("%s runs eagerly: compiling it failed (%s)", self.fn.__name__, self.failed)
            return result
