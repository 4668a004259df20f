"""Telemetry: GPU utilisation and memory through nvidia-ml-py when a GPU is present, the
``gpu`` field of the runtime's step records (:mod:`pgc_hvd.runtime.step_records` writes it).

On a machine without nvidia-ml-py or without an NVIDIA GPU, :func:`gpu_stats` returns
``{"available": False, "reason": ...}``: the absence is reported, never raised.

May import: the standard library and ``pynvml`` (nvidia-ml-py), lazily.
"""

from __future__ import annotations

import os

_state: dict = {}


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
        index = int(os.environ.get("HOROVOD_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0")))
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            _state["reason"] = "no NVIDIA GPU"
            return
        _state["handle"] = pynvml.nvmlDeviceGetHandleByIndex(index % count)
        _state["nvml"] = pynvml
    except Exception as err:  # no driver, no device
        _state["reason"] = f"NVML unavailable: {err}"


def gpu_stats() -> dict:
    """``{"available": True, "util": %, "mem_used_mb", "mem_total_mb"}`` or the reason absent."""
    _init()
    if "handle" not in _state:
        return {"available": False, "reason": _state.get("reason", "unknown")}
    nv, h = _state["nvml"], _state["handle"]
    try:
        util = nv.nvmlDeviceGetUtilizationRates(h)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
    except Exception as err:
        return {"available": False, "reason": f"NVML query failed: {err}"}
    return {"available": True, "util": float(util.gpu), "mem_used_mb": mem.used / 2**20,
            "mem_total_mb": mem.total / 2**20}
