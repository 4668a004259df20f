"""Staleness control (design note 002, step 3), error decomposition and scheme advice.

* :mod:`.rule`           the control rule: lower eta or c when L_hat^2 * displacement is a large
                         fraction of ||g_hat||^2, raise them back when it stays small (hysteresis);
* :mod:`.sim`            the rule in the simulator (a ``SimConfig.step_hook``);
* :mod:`.runtime`        the rule in the Horovod runtime through its public hooks
                         (``on_update``, ``on_record``, ``param_groups``): :class:`AdaptiveController`;
* :mod:`.decomposition`  PGC paper Lemmas 1 / 3: staleness bias vs stochastic part of the error;
* :mod:`.advise`         ``pgc-hvd advise RUN_DIR``: fit delays, simulate candidates, rank them.
"""

from .rule import ControlConfig, ControlRule, adaptive_default

__all__ = ["ControlConfig", "ControlRule", "adaptive_default"]
