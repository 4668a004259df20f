import numpy as np
import pytest

from pgc_hvd.delays import (Constant, DelayTrace, Exponential, Heterogeneous, LogNormal,
                                LongStraggler, Pareto, Recording, Replay, Sum, Zero, as_delay_model,
                                from_dict, parse_delay)


MODELS = [Zero(), Constant(0.2), Exponential(1.5, seed=3), LogNormal(-1.0, 0.5, seed=1),
          Pareto(2.5, 0.3, seed=2), LongStraggler(0.2, seed=4),
          Sum(LogNormal(0, 0.3), LongStraggler(0.1)), Heterogeneous(Exponential(1.0), [1, 2, 4])]


@pytest.mark.parametrize("model", MODELS, ids=str)
def test_deterministic_order_free_nonnegative_roundtrip(model):
    pairs = [(w, t) for t in range(6) for w in range(5)]
    first = {p: model.sample(*p) for p in pairs}
    again = {p: model.sample(*p) for p in reversed(pairs)}
    assert first == again
    assert all(v >= 0 for v in first.values())
    clone = from_dict(model.to_dict())
    assert all(clone.sample(*p) == first[p] for p in pairs)
    assert np.array_equal(model.matrix(5, 6), np.array([[first[(w, t)] for w in range(5)] for t in range(6)]))


def test_distribution_moments_and_seeds():
    n, steps = 40, 50
    e = Exponential(2.0, seed=0).matrix(n, steps)
    assert abs(e.mean() - 2.0) < 0.2
    assert not np.array_equal(e, Exponential(2.0, seed=1).matrix(n, steps))
    ln = LogNormal(0.0, 0.5).matrix(n, steps)
    assert abs(np.log(ln).mean()) < 0.05 and abs(np.log(ln).std() - 0.5) < 0.05
    st = LongStraggler(0.1, 10, 30).matrix(n, steps)
    hit = st[st > 0]
    assert 0.07 < hit.size / st.size < 0.13 and hit.min() >= 10 and hit.max() <= 30
    pa = Pareto(3.0, 1.0).matrix(n, steps)
    assert abs(pa.mean() - 0.5) < 0.1  # Lomax mean scale / (shape - 1)


def test_sum_components_independent_and_additive():
    a, b = LogNormal(0, 0.3, seed=5), LongStraggler(0.5, seed=5)
    s = a + b
    assert isinstance(s, Sum) and len((s + Zero()).parts) == 3
    assert s.sample(2, 3) == a.sample(2, 3) + b.sample(2, 3)


def test_parse_text_specs():
    m = parse_delay("exp:2")
    assert isinstance(m, Exponential) and m.mean == 2.0
    m = parse_delay("lognormal:mu=-1,sigma=0.5,seed=7+straggler:p=0.01,low=10,high=30")
    assert isinstance(m, Sum) and m.parts[0].seed == 7 and m.parts[1].p == 0.01
    assert parse_delay(str(m)) == m
    assert isinstance(as_delay_model(None), Zero)
    with pytest.raises(ValueError, match="unknown delay model 'gamma'"):
        parse_delay("gamma:1")


@pytest.mark.parametrize("spec, message", [
    ("exp:meen=1", "delay spec 'exp:meen=1'"),
    ("exp:mean=abc", "is not a number"),
    ("exp:mean=nan", "must be finite"),
    ("const:value=inf", "must be finite"),
    ("exp:mean=1,seed=-1", ">= 0"),
    ("fixed:count=1", "delay spec 'fixed:count=1'"),
])
def test_bad_specs_are_named(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_delay(spec)


def test_trace_save_replay_bit_identical(tmp_path):
    rec = Recording(Sum(LogNormal(0.1, 0.7, seed=9), LongStraggler(0.05, seed=9)))
    vals = {(w, t): rec.sample(w, t) for t in range(10) for w in range(7)}
    path = rec.trace.save(tmp_path / "trace.json")
    loaded = DelayTrace.load(path)
    assert loaded == rec.trace and loaded.model == rec.model.to_dict()
    rep = Replay(path)
    assert all(rep.sample(*k) == v for k, v in vals.items())
    with pytest.raises(ValueError, match=r"no entry for worker 0, step 99 \(the trace holds 7 "
                       r"workers \(0\.\.6\) and steps 0\.\.9\).*--save-trace"):
        rep.sample(0, 99)
    assert Replay(loaded, fallback=Constant(1.0)).sample(0, 99) == 1.0
    assert parse_delay(f"replay:{path}").sample(3, 4) == vals[(3, 4)]
    full = DelayTrace.from_model(Exponential(1.0), 3, 4)
    assert len(full) == 12 and sum(full.histogram(5)["counts"]) == 12


def test_fixed_stragglers_must_use_the_runs_n():
    from pgc_hvd.delays import check_workers
    check_workers(parse_delay("fixed:n=4,count=1,delay=5"), 4)
    with pytest.raises(ValueError, match="write fixed:n=12"):
        check_workers(parse_delay("exp:1+fixed:n=100,count=20,delay=5"), 12)


def test_trace_too_short_or_narrow_for_the_run_is_refused_up_front():
    from pgc_hvd.delays import check_trace_covers
    trace = DelayTrace.from_model(Exponential(1.0, seed=1), 4, 10)
    check_trace_covers(Replay(trace), 4, 10)
    check_trace_covers(Replay(trace) + Constant(0.1), 3, 10)       # fewer workers: all there
    with pytest.raises(ValueError, match=r"no step past 9, but the run has n=4 workers and 11 "
                       r"steps.*--save-trace"):
        check_trace_covers(Replay(trace), 4, 11)
    with pytest.raises(ValueError, match=r"no entry for worker\(s\) \[4, 5\].*n=6"):
        check_trace_covers(Constant(0.1) + Replay(trace), 6, 5)    # found inside a sum
    check_trace_covers(Replay(trace, fallback=Zero()), 6, 50)      # the fallback fills gaps
    with pytest.raises(ValueError, match="the trace is empty"):
        check_trace_covers(Replay(DelayTrace()), 1, 1)


TRACE_FORMAT = "pgc_hvd.delay_trace/1"


@pytest.mark.parametrize("text, message", [
    ('{"format": "pgc_hvd.delay_trace/1",\n "delays": [[0, 0, 1.0]', r"line 2 column \d+: not JSON"),
    ("[[0, 0, 1.0]]", "not a delay trace \\(format None"),
    ('{"format": "other/2", "delays": []}', "not a delay trace \\(format 'other/2'"),
    (f'{{"format": "{TRACE_FORMAT}"}}', "needs a 'delays' list"),
    (f'{{"format": "{TRACE_FORMAT}", "delays": {{"0": 1}}}}', "needs a 'delays' list"),
    (f'{{"format": "{TRACE_FORMAT}", "delays": [[0, 0, 1.0], [1, 0]]}}',
     r"entry 1 \(\[1, 0\]\): an entry must be \[worker, step, seconds\]"),
    (f'{{"format": "{TRACE_FORMAT}", "delays": [[0, 0, 1.0], 7]}}', "entry 1 \\(7\\)"),
    (f'{{"format": "{TRACE_FORMAT}", "delays": [[0, "a", 1.0]]}}', "entry 0 .*step must be an int"),
    (f'{{"format": "{TRACE_FORMAT}", "delays": [[0.5, 0, 1.0]]}}', "entry 0 .*worker must be an int"),
    (f'{{"format": "{TRACE_FORMAT}", "delays": [[-1, 0, 1.0]]}}', "entry 0 .*worker must be an int >= 0"),
    (f'{{"format": "{TRACE_FORMAT}", "delays": [[0, 0, 1.0], [1, 0, -0.5]]}}',
     "entry 1 .*delay must be finite seconds >= 0"),
    (f'{{"format": "{TRACE_FORMAT}", "delays": [[0, 0, NaN]]}}', "entry 0 .*finite seconds"),
    (f'{{"format": "{TRACE_FORMAT}", "delays": [[0, 0, Infinity]]}}', "entry 0 .*finite seconds"),
    (f'{{"format": "{TRACE_FORMAT}", "delays": [[0, 0, "1"]]}}', "entry 0 .*finite seconds"),
    (f'{{"format": "{TRACE_FORMAT}", "delays": [[0, 0, 1.0], [0, 0, 2.0]]}}',
     "entry 1: worker 0, step 0 appears twice"),
])
def test_a_damaged_trace_is_refused_naming_file_and_entry(tmp_path, text, message):
    """Bad JSON, wrong structure, missing keys, and negative, NaN or infinite delays: a
    ValueError naming the file and the line or entry, when the trace is loaded."""
    path = tmp_path / "trace.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"trace\.json[,:] .*" + message):
        DelayTrace.load(path)
    with pytest.raises(ValueError, match="trace.json"):
        parse_delay(f"replay:{path}")


def test_a_binary_trace_is_refused(tmp_path):
    path = tmp_path / "trace.json"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match=r"trace\.json: not a JSON delay trace"):
        DelayTrace.load(path)


def test_a_trace_built_in_memory_is_checked_too():
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="worker 1, step 2 has delay .*finite seconds >= 0"):
            DelayTrace({(0, 0): 0.5, (1, 2): bad})


def test_slow_worker_delays_one_worker_and_round_trips():
    from pgc_hvd.delays import SlowWorker, check_workers, from_dict, parse_delay

    m = parse_delay("slow:worker=2,delay=0.04")
    assert m == SlowWorker(2, 0.04) and from_dict(m.to_dict()) == m
    assert [m.sample(w, 7) for w in range(4)] == [0.0, 0.0, 0.04, 0.0]
    check_workers(m, 3)
    with pytest.raises(ValueError, match="slows worker 2, but the run has n=2"):
        check_workers(m, 2)
