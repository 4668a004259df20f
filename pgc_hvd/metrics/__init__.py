"""Step records shared by both engines, and what is made from them (tables, plots)."""

from pgc_hvd.metrics.records import RecordWriter, StepRecord, read_records

__all__ = ["RecordWriter", "StepRecord", "read_records"]
