"""``pgc-hvd`` command line: one entry point, one subcommand per job.

    pgc-hvd report codes --n 100 --stragglers 20,24   decode norms, residuals, decode times per code

Subcommands are registered lazily so that ``pgc-hvd --help`` does not import torch.
"""

from __future__ import annotations

import importlib
import sys

# subcommand path -> (module, function taking argv list, one-line help)
COMMANDS: dict[tuple[str, ...], tuple[str, str, str]] = {
    ("report", "codes"): ("pgc_hvd.apps.codes_report", "main",
                          "decode norms ||a_I||_1, residuals and decode times of every code"),
    ("report",): ("pgc_hvd.apps.report", "main",
                  "report RUN_DIR: table + plot of one run's (or a folder of runs') records"),
    ("demo",): ("pgc_hvd.apps.demo", "main",
                "the main job: hvd.DistributedOptimizer vs pgc-cr and bcgc, time to val accuracy"),
    ("train",): ("pgc_hvd.apps.train", "main",
                 "one training run on every rank (under horovodrun): scheme, s, delays, records"),
    ("simulate",): ("pgc_hvd.apps.simulate", "main",
                    "one simulated run: n virtual workers, real gradients, virtual time"),
    ("experiment", "control"): ("pgc_hvd.apps.control_experiment", "main",
                                "staleness control rule on its set-up (docs/control.md) --out DIR"),
    ("experiment", "deep"): ("pgc_hvd.apps.deep_experiment", "main",
                             "the papers' claims on MNIST-1D + a 1-D CNN (issue 22) --out DIR"),
    ("advise",): ("pgc_hvd.apps.advise", "main",
                  "advise RUN_DIR: fit delays per rank, simulate schemes and s, rank them"),
    ("experiment",): ("pgc_hvd.apps.experiments", "main",
                      "experiments: pgc, bcgc, staleness (the papers'), scale [--quick] --out DIR"),
}


def _usage() -> str:
    lines = ["usage: pgc-hvd COMMAND [ARGS...]", "", "commands:"]
    for path, (_, _, help_) in sorted(COMMANDS.items()):
        lines.append(f"  {' '.join(path):<24} {help_}")
    lines.append("")
    lines.append("Run `pgc-hvd COMMAND --help` for a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    for depth in (3, 2, 1):
        key = tuple(argv[:depth])
        if key in COMMANDS:
            module, func, _ = COMMANDS[key]
            return int(getattr(importlib.import_module(module), func)(argv[depth:]) or 0)
    print(f"pgc-hvd: unknown command {' '.join(argv[:2])!r}\n\n{_usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
