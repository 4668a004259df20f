"""Horovod's response cache is off in elastic runs (issue 38, docs/elastic.md "Killing rank 0").

Single-process checks of :func:`pgc_hvd.runtime.elastic.response_cache_off` (which the package's
import runs) and of the warning :class:`~pgc_hvd.runtime.elastic.ElasticState` gives when the
cache is on. The effect on a real job (rank-0 kills recovered with the cache off, the normal
path's time per version) is measured by ``benchmarks/elastic_random_kills.py`` and
``benchmarks/elastic_cache_overhead.py``.
"""

from __future__ import annotations

import os
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch

from pgc_hvd.runtime import elastic
from pgc_hvd.runtime.elastic import CACHE_ENV, cache_off, response_cache_off


def test_import_turned_the_cache_off_unless_the_user_set_it():
    # this process imported the package before any hvd.init(): the variable is 0 unless the
    # environment the tests run in set it (then it is the user's value, untouched)
    if os.environ.get(CACHE_ENV) not in (None, "0"):
        pytest.skip(f"{CACHE_ENV} set by the environment: {os.environ[CACHE_ENV]}")
    hvd = sys.modules.get("horovod.torch")
    if CACHE_ENV not in os.environ and hvd is not None and hvd.is_initialized():
        pytest.skip("an earlier test initialized Horovod in this process before the import")
    assert os.environ.get(CACHE_ENV) == "0"
    assert cache_off()


def test_unset_becomes_zero_and_the_users_value_wins():
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
                                            r"1024\).*--cache-capacity 0"):
        _state()
    monkeypatch.setenv(CACHE_ENV, "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _state()
