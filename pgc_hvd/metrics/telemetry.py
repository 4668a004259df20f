"""Telemetry: GPU utilisation and memory through nvidia-ml-py when a GPU is present, the
``gpu`` field of the runtime's step records (:mod:`pgc_hvd.runtime.step_records` writes it).

On a machine without nvidia-ml-py or without an NVIDIA GPU, :func:`gpu_stats` returns
``{"available": False, "reason": ...}``: the absence is reported, never raised.

Which GPU: the one this process computes on. NVML numbers every GPU of the host and ignores
``CUDA_VISIBLE_DEVICES``, so CUDA's device (torch's current device once CUDA is initialised,
else the local rank) is mapped through that variable (:func:`nvml_target`): a launcher that
gives each rank ``CUDA_VISIBLE_DEVICES=3`` has it report GPU 3, not GPU 0.

May import: the standard library, ``pynvml`` (nvidia-ml-py), lazily, and torch when the process
has already imported it (never imported here).
"""

from __future__ import annotations

import os
import sys
from typing import Optional

_state: dict = {}


def nvml_target(visible: Optional[str], cuda_index: int) -> tuple:
    """NVML's name for CUDA device ``cuda_index`` under ``CUDA_VISIBLE_DEVICES=visible``:
    ``("index", i)`` (a physical index; ``visible`` unset or empty: CUDA's index itself) or
    ``("uuid", text)`` (a ``GPU-...``/``MIG-...`` entry, possibly a prefix, as CUDA allows).
    An index past the list is returned as it is (CUDA would not have it either)."""
    if visible is None or not visible.strip():
        return ("index", int(cuda_index))
    entries = [e.strip() for e in visible.split(",")]
    if not 0 <= cuda_index < len(entries) or not entries[cuda_index]:
        return ("index", int(cuda_index))
    entry = entries[cuda_index]
    return ("index", int(entry)) if entry.isdigit() else ("uuid", entry)


def _cuda_index() -> int:
    """This process's CUDA device: torch's current one when CUDA is initialised in it (never
    initialising it here), else the local rank (Horovod's or torchrun's variable)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 -- a broken CUDA set-up: fall back to the local rank
        pass
    return int(os.environ.get("HOROVOD_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0")))


def _handle(pynvml, target: tuple, count: int):
    kind, value = target
    if kind == "index":
        # no CUDA_VISIBLE_DEVICES: the local rank may exceed the GPUs (ranks sharing them)
        return pynvml.nvmlDeviceGetHandleByIndex(value % count)
    for i in range(count):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        if uuid.startswith(value):
            return h
    raise LookupError(f"no GPU with UUID {value!r} (CUDA_VISIBLE_DEVICES)")


def _init():
    if "handle" in _state or "reason" in _state:
        return
    try:
        import pynvml  # provided by the nvidia-ml-py package
    except ImportError:
        _state["reason"] = "nvidia-ml-py not installed"
        return
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            _state["reason"] = "no NVIDIA GPU"
            return
        target = nvml_target(os.environ.get("CUDA_VISIBLE_DEVICES"), _cuda_index())
        _state["handle"] = _handle(pynvml, target, count)
        _state["nvml"] = pynvml
        _state["target"] = target
    except Exception as err:  # no driver, no device
        _state["reason"] = f"NVML unavailable: {err}"


def gpu_stats() -> dict:
    """``{"available": True, "util": %, "mem_used_mb", "mem_total_mb", "nvml_device"}`` (which
    GPU NVML read: "index 3" or "uuid GPU-..."), or the reason absent."""
    _init()
    if "handle" not in _state:
        return {"available": False, "reason": _state.get("reason", "unknown")}
    nv, h = _state["nvml"], _state["handle"]
    try:
        util = nv.nvmlDeviceGetUtilizationRates(h)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
    except Exception as err:
        return {"available": False, "reason": f"NVML query failed: {err}"}
    kind, value = _state["target"]
    return {"available": True, "util": float(util.gpu), "mem_used_mb": mem.used / 2**20,
            "mem_total_mb": mem.total / 2**20, "nvml_device": f"{kind} {value}"}
