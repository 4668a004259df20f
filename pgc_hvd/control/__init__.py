"""Staleness control (docs/control.md): the rule and its adaptors to the two engines.

* :mod:`.rule`           the control rule: lower eta or c when L_hat^2 * displacement is a large
                         fraction of ||g_hat||^2, raise them back when it stays small (hysteresis);
* :mod:`.sim`            the rule in the simulator (a ``SimConfig.step_hook``);
* :mod:`.runtime`        the rule in the Horovod runtime through its public hooks
                         (``on_update``, ``on_record``, ``param_groups``): :class:`AdaptiveController`.

The adaptors use only what an engine hands them (the simulator object, the optimizer), so this
package imports neither engine; the error-decomposition probe is :mod:`pgc_hvd.sim.decomposition`,
``pgc-hvd advise`` and ``pgc-hvd experiment control`` are in :mod:`pgc_hvd.apps`.
"""

from .rule import ControlConfig, ControlRule, adaptive_default

__all__ = ["ControlConfig", "ControlRule", "adaptive_default"]
