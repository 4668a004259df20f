"""The command lines that run under ``horovodrun`` keep their options through its parser.

horovodrun's argparse reads every word of the command line, the launched command's included,
and refuses one that abbreviates two or more of its own options (``--auto`` against its
``--autotune...``: "ambiguous option") before any rank starts. So an option of ``pgc-hvd
train`` or of the elastic recipe must not be such a prefix: checked here with Horovod's own
parser, for every option string the two parsers define."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _option_strings(parser):
    return sorted({o for a in parser._actions for o in a.option_strings if o.startswith("--")})


def _parsers():
    from pgc_hvd.apps.train import build_parser as train_parser
    sys.path.insert(0, str(ROOT / "launch"))
    try:
        import elastic_train
    finally:
        sys.path.remove(str(ROOT / "launch"))
    return {"pgc-hvd train": train_parser(),
            "launch/elastic_train.py": elastic_train.build_parser()}


def test_every_option_of_the_launched_commands_passes_horovodruns_parser(monkeypatch):
    launch = pytest.importorskip("horovod.runner.launch")
    refused = []
    for name, parser in _parsers().items():
        for opt in _option_strings(parser):
            if opt in ("--help",):
                continue
            argv = ["horovodrun", "-np", "2", "-H", "localhost:2", "python", name, opt, "1"]
            monkeypatch.setattr(sys, "argv", argv)
            try:
                args = launch.parse_args()
            except SystemExit:
                refused.append(f"{name} {opt}")
                continue
            assert args.command[-2:] == [opt, "1"], (name, opt, args.command)
    assert not refused, f"horovodrun refuses these options of launched commands: {refused}"


def test_the_check_fails_for_an_option_horovodrun_refuses(monkeypatch, capsys):
    launch = pytest.importorskip("horovod.runner.launch")
    monkeypatch.setattr(sys, "argv", ["horovodrun", "-np", "2", "-H", "localhost:2", "python",
                                      "x.py", "--auto", "s_max=1"])
    with pytest.raises(SystemExit):
        launch.parse_args()
    assert "ambiguous option: --auto" in capsys.readouterr().err
