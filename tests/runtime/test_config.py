"""RuntimeConfig on its own, in one process: every default, every check (each error naming the
argument and the fix), and the typed values ``checked`` hands the encoder and codecs
(``stragglers: int``, ``compression: TopK | None``, ``wire_dtype: torch.dtype``), Horovod's
``compression`` keyword mapped once."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import pgc_hvd.torch as pgc_torch
from pgc_hvd.compress import DenseCodec, Fp16Codec, Fp16SparseCodec, SparseCodec, TopK
from pgc_hvd.compress.encoder import MessageEncoder
from pgc_hvd.delays import Exponential
from pgc_hvd.runtime.config import (CONTROLS, RENAMED_KEYWORDS, RuntimeConfig,
                                    check_parameters, cross_rank_fields, from_horovod,
                                    horovod_op, horovod_wire_dtype, metric_names,
                                    parameter_names, renamed_keyword, takes_three, wire_format)
from pgc_hvd.schemes import get_scheme
from pgc_hvd.schemes.protocol import Scheme

LOGGER = "pgc_hvd.runtime"


def checked(n=4, **fields):
    return RuntimeConfig(**fields).checked(n)


def one_process_notes(caplog):
    return [r for r in caplog.records if r.name == LOGGER and "n >= 2 ranks" in r.getMessage()]


# -- defaults ---------------------------------------------------------------------------------
def test_defaults_are_typed_values():
    c = checked(4)
    assert c.scheme == "pgc-cr" and c.stragglers == 1 and type(c.stragglers) is int
    assert c.compression is None and c.wire_dtype == torch.float32
    assert c.delay is None and c.records is None and c.replay_arrivals is None
    assert c.scheme_options == {} and c.name == "pgc" and c.timeout == 60.0
    assert c.poll_interval == 0.002 and c.straggler_policy == "continue" and not c.cancel
    assert c.optimistic is None and c.control in CONTROLS
    assert c.backward_passes_per_step == 1 and c.op_scale == 1.0 and c.metrics == ()
    assert c.momentum_correction is True


def test_checking_a_checked_config_changes_nothing():
    for fields in ({}, {"compression": pgc_torch.Compression.fp16},
                   {"compression": TopK(0.1), "stragglers": 2, "delay": "exp:mean=0.1,seed=1",
                    "replay_arrivals": [(np.int64(1), 0)]}):
        once = checked(4, **fields)
        assert once.checked(4) == once


@pytest.mark.parametrize("scheme, n, s", [
    ("pgc-cr", 4, 1), ("bcgc", 6, 1), ("bounded-staleness", 3, 1), ("is-sgd", 2, 1),
    ("dgd", 4, 0),        # dgd waits for every rank: s = 0
    ("pgc-cr", 1, 0), ("bcgc", 1, 0), ("dgd", 1, 0),      # one rank: nobody to wait less for
])
def test_the_straggler_default_is_the_schemes(scheme, n, s):
    c = checked(n, scheme=scheme)
    assert c.stragglers == s
    get_scheme(scheme, n, c.stragglers)    # the scheme takes it


def test_one_rank_with_the_default_runs_s0_and_says_so_once(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    assert checked(1).stragglers == 0
    (note,) = one_process_notes(caplog)
    assert "pgc-cr runs with s = 0" in note.getMessage()
    assert "stragglers=0" in note.getMessage()        # how to say it explicitly
    caplog.clear()
    for quiet in ({"stragglers": 0}, {"scheme": "dgd"}):   # asked for, or the usual default
        assert checked(1, **quiet).stragglers == 0
    assert checked(2).stragglers == 1
    with pytest.raises(TypeError):           # a refused config says nothing about s
        checked(1, compression="fp16")
    assert one_process_notes(caplog) == []


def scheme_of(n=4, **fields):
    """The scheme the optimizer builds right after the config's check, before any collective
    (its construction: the one check of a given s)."""
    return checked(n, **fields).build_scheme(n, [{"params": [], "momentum": 0.9}])


def test_an_explicit_budget_is_checked_once_with_the_fix(monkeypatch):
    with pytest.raises(ValueError, match=r"needs 0 <= s <= n-1.*use s in \[0, 0\]"):
        scheme_of(1, stragglers=1)
    with pytest.raises(ValueError, match=r"use s in \[0, 3\]"):
        scheme_of(4, stragglers=4)
    with pytest.raises(ValueError, match=r"use s in \[0, 3\]"):
        scheme_of(4, stragglers=-1)
    with pytest.raises(ValueError, match=r"dgd waits for all n=4 workers.*pass s=0.*is-sgd"):
        scheme_of(4, scheme="dgd", stragglers=1)
    s = scheme_of(4, stragglers=np.int64(2)).s
    assert s == 2 and type(s) is int
    calls = []                  # checked once: by the scheme's construction, not the config
    real = Scheme.check_stragglers.__func__
    monkeypatch.setattr(Scheme, "check_stragglers",
                        classmethod(lambda cls, s, n=None: calls.append((s, n)) or real(cls, s, n)))
    assert scheme_of(4, stragglers=2).s == 2 and calls == [(2, 4)]


@pytest.mark.parametrize("bad", [1.9, True, "1"])
def test_a_budget_that_is_not_an_int_is_a_type_error(bad):
    with pytest.raises(TypeError, match="stragglers must be an int"):
        scheme_of(4, stragglers=bad)


def test_an_unknown_scheme_is_named():
    with pytest.raises(ValueError, match="unknown scheme 'pgc'; valid names: dgd"):
        checked(4, scheme="pgc")


# -- compression: Horovod's keyword mapped once -----------------------------------------------
def test_compression_becomes_a_topk_or_none_and_a_wire_dtype():
    topk = TopK(0.05)
    assert wire_format(None) == (None, torch.float32)
    assert wire_format(topk) == (topk, torch.float32)
    assert wire_format(topk, torch.float16) == (topk, torch.float16)
    assert wire_format(pgc_torch.Compression.fp16) == (None, torch.float16)
    assert wire_format(pgc_torch.Compression.none) == (None, torch.float32)
    c = checked(4, compression=pgc_torch.Compression.fp16)
    assert c.compression is None and c.wire_dtype == torch.float16
    assert cross_rank_fields(c)["extra"]["wire dtype"] == "float16"
    assert cross_rank_fields(checked(4))["extra"]["wire dtype"] == "float32"
    c = checked(4, compression=topk)
    assert c.compression is topk and c.wire_dtype == torch.float32


def test_the_typed_values_go_to_the_encoder_as_they_are():
    for compression, codec in ((pgc_torch.Compression.fp16, Fp16Codec), (TopK(0.5), SparseCodec)):
        c = checked(4, compression=compression)
        enc = MessageEncoder(16, c.compression, complex_messages=False, wire_dtype=c.wire_dtype)
        assert type(enc.codec) is codec
    c = checked(4, compression=TopK(0.5), wire_dtype=torch.float16)
    assert type(MessageEncoder(16, c.compression, complex_messages=False,
                               wire_dtype=c.wire_dtype).codec) is Fp16SparseCodec


@pytest.mark.parametrize("bad", ["topk:0.01", "fp16", 16, torch.float16])
def test_an_unknown_compression_is_refused_naming_what_works(bad):
    with pytest.raises(TypeError) as err:
        checked(4, compression=bad)
    msg = str(err.value)
    assert "hvd.Compression.none" in msg and "hvd.Compression.fp16" in msg and "TopK" in msg


def test_a_wire_dtype_without_a_codec_or_against_the_compression_is_refused():
    with pytest.raises(ValueError, match="torch.float32 .* or torch.float16"):
        checked(4, wire_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="give one of them"):
        checked(4, compression=pgc_torch.Compression.fp16, wire_dtype=torch.float32)


def test_horovods_compression_names_map_to_wire_dtypes():
    hvd = pytest.importorskip("horovod.torch")
    from horovod.torch.compression import Compressor, FP16Compressor, NoneCompressor
    assert horovod_wire_dtype(hvd.Compression.fp16) == torch.float16
    assert horovod_wire_dtype(hvd.Compression.none) == torch.float32
    assert horovod_wire_dtype(None) == torch.float32
    assert horovod_wire_dtype(FP16Compressor()) == torch.float16
    assert horovod_wire_dtype(NoneCompressor) == torch.float32
    c = checked(4, compression=hvd.Compression.fp16)
    assert c.compression is None and c.wire_dtype == torch.float16

    class Gzip(Compressor):
        pass

    for bad in (Gzip, "fp16", TopK(0.01)):
        with pytest.raises(TypeError) as err:
            horovod_wire_dtype(bad)
        msg = str(err.value)
        assert "hvd.Compression.none" in msg and "hvd.Compression.fp16" in msg and "TopK" in msg


# -- the other arguments ----------------------------------------------------------------------
def test_good_arguments_pass_and_a_delay_spec_is_parsed():
    c = checked(4, delay="exp:mean=0.1,seed=1", compression=TopK(0.05))
    assert c.stragglers == 1 and isinstance(c.delay, Exponential)
    assert checked(4, delay=c.delay).delay is c.delay
    c = checked(4, replay_arrivals=[(np.int64(3), np.int64(0)), [0, 1]], name=7, timeout=5)
    assert c.replay_arrivals == [(3, 0), (0, 1)] and c.name == "7" and c.timeout == 5.0
    assert type(c.timeout) is float and c.replay_steps(0) == [1] and c.replay_steps(3) == [0]


@pytest.mark.parametrize("overrides, error, message", [
    ({"delay": 0.1}, TypeError, "delay must be None, a delay model .*sample\\(worker, step\\)"),
    ({"delay": "exp:mean=-1"}, ValueError, "mean"),
    ({"records": "/tmp/records.jsonl"}, TypeError, "write\\(record\\)"),
    ({"on_record": "print"}, TypeError, "on_record must be None or callable"),
    ({"on_update": 3}, TypeError, "on_update must be None or callable"),
    ({"timeout": -1}, ValueError, "timeout must be finite seconds > 0"),
    ({"timeout": float("inf")}, ValueError, "timeout must be finite seconds > 0"),
    ({"poll_interval": 0}, ValueError, "poll_interval must be finite seconds > 0"),
    ({"poll_interval": True}, ValueError, "poll_interval must be finite seconds > 0"),
    ({"replay_arrivals": [(5, 0)]}, ValueError, "outside \\[0, n\\)"),
    ({"optimistic": 1}, TypeError, "optimistic must be None"),
    ({"control": "gossip"}, ValueError, "control must be 'allgather', 'store' or 'log'"),
    ({"straggler_policy": "drop"}, ValueError, "straggler_policy must be 'continue' or 'cancel'"),
])
def test_bad_arguments_are_named(overrides, error, message):
    with pytest.raises(error, match=message):
        checked(4, **overrides)


def test_delays_is_delays_old_name_warned_once_with_the_fix():
    """``delay=`` is the one name (the simulator's ``delay=``, the CLIs' ``--delay``); the old
    ``delays=`` still gives its value, with one FutureWarning a process naming the fix; both
    at once are refused."""
    import warnings
    assert RENAMED_KEYWORDS == {"delays": "delay"}
    warned, model = set(), Exponential(0.1, seed=1)
    assert renamed_keyword("delays", None, model, warned) is model      # the new name: silent
    assert not warned
    with pytest.warns(FutureWarning, match=r"delays= is now delay=.*pass delay=\.\.\. instead"):
        assert renamed_keyword("delays", model, None, warned) is model
    with warnings.catch_warnings():
        warnings.simplefilter("error")                               # a second warning fails
        assert renamed_keyword("delays", "exp:mean=1", None, warned) == "exp:mean=1"
    with pytest.raises(TypeError, match="delay= and delays= .* both given: pass delay= only"):
        renamed_keyword("delays", model, model, set())


def test_a_delay_model_for_another_world_is_refused():
    from pgc_hvd.delays import FixedStragglers
    with pytest.raises(ValueError, match="n=6"):
        checked(4, delay=FixedStragglers(6, 1, 0.1))


# -- the checks that need the built scheme -------------------------------------------------------
def test_the_min_error_decoder_needs_compressed_messages():
    scheme = get_scheme("bcgc", 4, 1, decoder="min-error")
    with pytest.raises(ValueError, match="bcgc with decoder='min-error'.*needs top-kappa "
                                         "compression: pass compression=pgc_hvd.compress.TopK"):
        checked(4, scheme="bcgc", scheme_options={"decoder": "min-error"}).check_scheme(scheme)
    with pytest.raises(ValueError, match="needs top-kappa compression"):
        checked(4, compression=pgc_torch.Compression.fp16).check_scheme(scheme)
    checked(4, compression=TopK(0.05)).check_scheme(scheme)
    checked(4).check_scheme(get_scheme("bcgc", 4, 1))     # other decoders: dense is fine


def test_cancel_is_refused_where_late_messages_are_used_or_a_schedule_is_replayed():
    cancel = checked(4, straggler_policy="cancel")
    assert cancel.cancel
    cancel.check_scheme(get_scheme("pgc-cr", 4, 1))
    with pytest.raises(ValueError, match="drops late messages, but bounded-staleness uses them"):
        cancel.check_scheme(get_scheme("bounded-staleness", 4, 1))
    with pytest.raises(ValueError, match="use straggler_policy='continue'"):
        checked(4, straggler_policy="cancel",
                replay_arrivals=[(0, 0)]).check_scheme(get_scheme("pgc-cr", 4, 1))


def test_the_cross_rank_fields_are_the_checked_values():
    c = checked(4, compression=TopK(0.1), stragglers=np.int64(2), metrics=("acc",))
    fields = cross_rank_fields(c)
    assert fields["stragglers"] == 2 and fields["compression"] == TopK(0.1)
    assert fields["scheme"] == "pgc-cr" and fields["options"] == {}
    assert fields["extra"]["wire dtype"] == "float32"
    assert fields["extra"]["metrics (names)"] == ["acc"]


# -- Horovod's keywords, parameters, metrics (every check on its own) -----------------------
@pytest.fixture(scope="module")
def hvd():
    hvd = pytest.importorskip("horovod.torch")
    hvd.init()   # a world of one rank: hvd.size() for op=hvd.Sum
    return hvd


def horovod_keywords(hvd, **kw):
    args = dict(backward_passes_per_step=1, op=None, gradient_predivide_factor=1.0,
                num_groups=0, groups=None, sparse_as_dense=False, process_set=None, metrics=())
    args.update(kw)
    return from_horovod(hvd, **args)


def test_horovods_keywords_map_to_typed_fields(hvd):
    assert horovod_keywords(hvd) == {"op_scale": 1.0, "backward_passes_per_step": 1,
                                     "metrics": ()}
    got = horovod_keywords(hvd, op=hvd.Sum, backward_passes_per_step=2, metrics=["acc"],
                           num_groups=3, groups=[[]], sparse_as_dense=True,
                           process_set=hvd.global_process_set)
    assert got == {"op_scale": float(hvd.size()), "backward_passes_per_step": 2,
                   "metrics": ("acc",)}
    assert horovod_op(hvd, hvd.Average, 2.0) == 1.0


@pytest.mark.parametrize("kw, message", [
    ({"op": "sum"}, "op must be hvd.Average or hvd.Sum"),
    ({"op": "adasum"}, "op must be hvd.Average or hvd.Sum"),
    ({"gradient_predivide_factor": 0}, "gradient_predivide_factor must be a finite number > 0"),
    ({"gradient_predivide_factor": True}, "gradient_predivide_factor must be a finite number"),
    ({"gradient_predivide_factor": float("nan")}, "gradient_predivide_factor must be a finite"),
    ({"backward_passes_per_step": 0}, "backward_passes_per_step must be an int >= 1"),
    ({"backward_passes_per_step": True}, "backward_passes_per_step must be an int >= 1"),
    ({"num_groups": -1}, "num_groups must be an int >= 0"),
    ({"groups": "all"}, "groups must be None, an int or a list"),
    ({"sparse_as_dense": 1}, "sparse_as_dense must be a bool"),
    ({"process_set": object()}, "a process set other than the global one is refused"),
    ({"metrics": ["acc", "acc"]}, "names must be distinct"),
    ({"metrics": ["loss"]}, "not 'step', 'loss' or 'ranks'"),
])
def test_horovods_bad_keywords_are_named(hvd, kw, message):
    with pytest.raises(ValueError, match=message):
        horovod_keywords(hvd, **kw)


def test_adasum_and_a_predivide_factor_with_sum_are_refused_with_the_fix(hvd):
    with pytest.raises(ValueError, match="Adasum is refused.*Use op=hvd.Average"):
        horovod_op(hvd, hvd.Adasum, 1.0)
    with pytest.raises(ValueError, match="needs op=hvd.Average"):
        horovod_op(hvd, hvd.Sum, 2.0)


@pytest.mark.parametrize("bad", ["acc", ["acc", 3], [""]])
def test_metric_names_must_be_a_list_of_names(bad):
    with pytest.raises(TypeError, match="metrics must be a list of metric names"):
        metric_names(bad)


def test_complex_or_integer_parameters_are_refused_naming_them():
    ok = [torch.zeros(2, dtype=dt) for dt in (torch.float32, torch.float16, torch.bfloat16,
                                              torch.float64)]
    check_parameters(ok, {})
    bad = torch.zeros(2, dtype=torch.complex64)
    with pytest.raises(TypeError, match=r"parameters head.w \(complex64\) are not real"):
        check_parameters(ok + [bad], {id(bad): "head.w"})
    with pytest.raises(TypeError, match=r"#0 \(int64\)"):
        check_parameters([torch.zeros(2, dtype=torch.int64)], {})


def test_named_parameters_must_name_every_trainable_parameter():
    a, b = torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)
    frozen = torch.zeros(1)
    assert parameter_names([a, b], None) == {}
    assert parameter_names([a, b, frozen], [("a", a), ("b", b)]) == {id(a): "a", id(b): "b"}
    with pytest.raises(ValueError, match=r"does not name 1 of the optimizer's parameters "
                                         r"\(indices \[1\]\)"):
        parameter_names([a, b], iter([("a", a)]))


def test_on_update_with_three_arguments_is_recognised_once():
    assert takes_three(lambda t, flat, decision: None) and takes_three(lambda *a: None)
    assert not takes_three(lambda t, flat: None) and not takes_three(lambda t, flat, *, d: None)


def test_optimistic_follows_the_payload_size_on_the_allgather_only():
    small = DenseCodec(8)
    assert checked(4, control="allgather").effective_optimistic(small, "cpu", 4)
    assert not checked(4, control="log").effective_optimistic(small, "cpu", 4)
    assert not checked(4).effective_optimistic(small, "cpu", 4)      # the default plane: log
    assert not checked(4, optimistic=False).effective_optimistic(small, "cpu", 4)
    assert checked(4, optimistic=True, control="log").effective_optimistic(small, "cpu", 4)
    assert not checked(4, control="allgather").effective_optimistic(DenseCodec(10 ** 8),
                                                                    "cpu", 4)
