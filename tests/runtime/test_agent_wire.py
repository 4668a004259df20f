"""The agent's wire formats across ranks (tests/runtime/scripts/agent_wire_checks.py under horovodrun):
fp16 messages through the allreduce and the optimistic path, the fp32 fallback on fp16
overflow, and user metrics in the control rows with a slowed rank. Both runs share one launch
(``launch_group``)."""

from pathlib import Path

import pytest
from checks import passed

SCRIPT = Path(__file__).resolve().parent / "scripts" / "agent_wire_checks.py"
RUNS = [("fp16", "test_fp16_messages_decode_sum_of_fp16_rows_identically_with_half_the_bytes",
         SCRIPT, ["fp16"]),
        ("metrics", "test_metrics_are_the_mean_of_the_used_ranks_and_identical_everywhere", SCRIPT,
         ["metrics"])]


LAUNCH_GROUPS = [("horovodrun", 3, RUNS)]


@pytest.mark.multirank
def test_fp16_messages_decode_sum_of_fp16_rows_identically_with_half_the_bytes(hvd3):
    proc = hvd3.ran("fp16")
    for name in ("fp16_allreduce_path", "fp16_optimistic_path",
                 "fp16_overflow_falls_back_to_fp32", "fp16_sparse_allgather_and_densified"):
        assert passed(proc.stdout).get(name) == [0, 1, 2], proc.stdout


@pytest.mark.multirank
def test_metrics_are_the_mean_of_the_used_ranks_and_identical_everywhere(hvd3):
    proc = hvd3.ran("metrics")
    for channel in ("allgather", "store"):
        assert passed(proc.stdout).get(f"metrics_identical_and_mean_of_used_{channel}") \
            == [0, 1, 2], proc.stdout
