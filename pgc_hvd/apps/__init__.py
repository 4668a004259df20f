"""Applications: what the ``pgc-hvd`` commands run, above both engines.

* :mod:`.simulate`            ``pgc-hvd simulate``: one simulated run (:func:`pgc_hvd.sim.run.simulate`);
* :mod:`.train`               ``pgc-hvd train``: one Horovod run on every rank (under ``horovodrun``);
* :mod:`.experiments`         ``pgc-hvd experiment {pgc,bcgc,staleness,scale}``: the papers'
                              experiments on the simulator (``scale``: :mod:`.scale`);
* :mod:`.control_experiment`  ``pgc-hvd experiment control``: the staleness control rule;
* :mod:`.advise`              ``pgc-hvd advise RUN_DIR``: fit a run's delays, simulate schemes, rank them;
* :mod:`.report`              ``pgc-hvd report RUN_DIR``: table and plot of step records;
* :mod:`.codes_report`        ``pgc-hvd report codes``: decode norms, residuals and times of every code;
* :mod:`.tables`              the markdown tables they write.
* :mod:`.local_ranks`         a script on local ranks and its ``RESULT`` line (the benchmarks'
                              launcher, benchmarks/).

An application may import any layer below it (docs/architecture.md); nothing below imports it.
"""
