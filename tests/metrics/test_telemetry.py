"""Which GPU the records' ``gpu`` field reads (NVML numbers the host's GPUs and ignores
CUDA_VISIBLE_DEVICES), and its absence reported, never raised, on a machine without one."""

import pytest

from pgc_hvd.metrics import telemetry


@pytest.mark.parametrize("visible, index, want", [
    (None, 2, ("index", 2)),                     # no variable: CUDA's index is NVML's
    ("", 1, ("index", 1)),
    ("3", 0, ("index", 3)),                      # one GPU per rank by the launcher
    ("2,3", 1, ("index", 3)),
    (" 4, 5 ", 0, ("index", 4)),
    ("GPU-8932f937,GPU-11", 0, ("uuid", "GPU-8932f937")),   # a UUID prefix, as CUDA allows
    ("MIG-abc", 0, ("uuid", "MIG-abc")),
    ("1", 3, ("index", 3)),                      # past the list: left as it is
])
def test_cuda_device_mapped_through_cuda_visible_devices(visible, index, want):
    assert telemetry.nvml_target(visible, index) == want


class _Nvml:
    """nvidia-ml-py's calls _handle makes, over a host of three GPUs (not the code under test)."""
    uuids = ["GPU-aaaa-0", "GPU-bbbb-1", "GPU-cccc-2"]

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("handle", i)

    def nvmlDeviceGetUUID(self, h):
        return self.uuids[h[1]].encode()        # older nvidia-ml-py returns bytes


def test_handle_by_index_wraps_and_by_uuid_prefix():
    nv = _Nvml()
    assert telemetry._handle(nv, ("index", 4), 3) == ("handle", 1)   # ranks sharing GPUs
    assert telemetry._handle(nv, ("uuid", "GPU-cccc"), 3) == ("handle", 2)
    with pytest.raises(LookupError, match="GPU-dddd"):
        telemetry._handle(nv, ("uuid", "GPU-dddd"), 3)


def test_without_a_gpu_the_absence_is_reported(monkeypatch):
    monkeypatch.setattr(telemetry, "_state", {})
    got = telemetry.gpu_stats()
    if got["available"]:
        pytest.skip("this machine has an NVIDIA GPU")
    assert got["reason"]
