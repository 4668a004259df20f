"""Single-process simulator: n virtual workers and one decoder in virtual time.

* :mod:`pgc_hvd.delays`: seeded straggler delay models and delay traces (shared with the
  Horovod runtime's straggler injection).
"""
