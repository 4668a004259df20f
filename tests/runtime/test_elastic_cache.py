"""Horovod's response cache is off in elastic runs (docs/elastic.md "Killing rank 0").

Single-process checks of :func:`pgc_hvd.runtime.elastic.response_cache_off` (which an elastic
script calls before ``hvd.init()``, as the recipe does; the import changes nothing) and of the
warning :class:`~pgc_hvd.runtime.elastic.ElasticState` gives when the
cache is on. The effect on a real job (rank-0 kills recovered with the cache off, the normal
path's time per version) is measured by ``benchmarks/elastic/elastic_random_kills.py`` and
``benchmarks/elastic/elastic_cache_overhead.py``.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pgc_hvd.runtime import elastic
from pgc_hvd.runtime.elastic import CACHE_ENV, cache_off, response_cache_off


def test_the_import_changes_no_environment_variable():
    """Importing the package leaves Horovod's settings alone (a pytest session or a notebook
    that imports it keeps the response cache for its other jobs); an elastic script calls
    :func:`response_cache_off` before ``hvd.init()``, as the recipe does."""
    import subprocess
    env = {k: v for k, v in os.environ.items() if k != CACHE_ENV}
    code = ("import os, pgc_hvd.runtime.elastic as e; "
            f"print(repr(os.environ.get({CACHE_ENV!r})), e.cache_off())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "False"]


def test_the_recipe_turns_the_cache_off_before_init():
    src = (Path(__file__).resolve().parents[2] / "launch" / "elastic_train.py").read_text()
    main = src[src.index("def main("):]
    assert main.index("    response_cache_off()\n") < main.index("    hvd.init()\n")


def test_unset_becomes_zero_and_the_users_value_wins(monkeypatch):
    # Horovod not initialized in this process (an earlier test may have: see below)
    monkeypatch.setitem(sys.modules, "horovod.torch", SimpleNamespace(is_initialized=lambda: False))
    env = {}
    assert response_cache_off(env) and env == {CACHE_ENV: "0"}
    env = {CACHE_ENV: "1024"}
    assert not response_cache_off(env) and env == {CACHE_ENV: "1024"}
    env = {CACHE_ENV: " 0 "}
    assert response_cache_off(env) and env == {CACHE_ENV: " 0 "}


def test_cache_off_reads_the_value_horovod_will():
    assert not cache_off({})                      # Horovod's default: 1024
    assert cache_off({CACHE_ENV: "0"})
    assert not cache_off({CACHE_ENV: "16"})
    assert not cache_off({CACHE_ENV: "many"})     # not a number: treated as on (warned about)


def test_left_alone_once_horovod_is_initialized(monkeypatch):
    """After ``hvd.init()`` the current world has the cache on; a later world of this process
    must too (its ranks would disagree on the negotiation otherwise), so nothing is set."""
    started = SimpleNamespace(is_initialized=lambda: True)
    monkeypatch.setitem(sys.modules, "horovod.torch", started)
    env = {}
    assert not response_cache_off(env) and env == {}
    not_started = SimpleNamespace(is_initialized=lambda: False)
    monkeypatch.setitem(sys.modules, "horovod.torch", not_started)
    assert response_cache_off(env) and env == {CACHE_ENV: "0"}


def _state():
    pytest.importorskip("horovod.common.elastic")
    model = torch.nn.Linear(2, 1)
    hvd = SimpleNamespace(rank=lambda: 0, size=lambda: 1)
    return elastic.ElasticState(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                make_optimizer=lambda base: None, hvd=hvd, cascade=False)


def test_elastic_state_warns_when_the_cache_is_on(monkeypatch):
    monkeypatch.setenv(CACHE_ENV, "1024")
    with pytest.warns(RuntimeWarning, match=r"response cache is on \(HOROVOD_CACHE_CAPACITY="
                                            r"1024\).*--cache-capacity 0.*response_cache_off\(\)"):
        _state()
    monkeypatch.setenv(CACHE_ENV, "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _state()
