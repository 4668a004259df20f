"""Shared pytest configuration for pgc_hvd.

Markers (declared in pyproject.toml):
  * ``gpu``: needs a CUDA device; skipped cleanly when torch sees none.
  * ``multirank``: runs a script under ``horovodrun --gloo -np N -H localhost:N
    --network-interface lo`` through the :func:`horovodrun` fixture (skipped when horovod is not
    installed), or under ``torchrun --standalone --nproc-per-node N`` with
    ``GLOO_SOCKET_IFNAME=lo`` through the :func:`torchrun` fixture (the torch engine; horovod
    hidden from the ranks by default). Both pin gloo to the loopback interface: ranks on one
    machine never talk over its network address (tests/multirank/test_loopback.py checks). The
    runs that end cleanly are entries of one launch per launcher and world size instead
    (:func:`launch_group`, through the same launchers); the runs that kill, freeze or stop
    ranks have a launch each, two at a time, above the unit tests' priority
    (:func:`fault_launches`).
  * ``bench``: pytest-benchmark suites, kept in ``benchmarks/`` (not collected by default).
  * ``slow``: a test that takes more than a few seconds on 2 cores without launching ranks.
  * ``quick``: set here, never by hand (:func:`is_quick`): ``bash launch/test.sh -m quick`` runs
    every part's unit tests and one multi-rank launch per engine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from launch_watch import run_watched
from session_guards import leftover_threads

REPO_ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent     # on the ranks' path too: checks.py (``ok``)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


#: the multi-rank tests of the quick suite (``-m quick``): one launch per engine, each the
#: smallest that trains end to end through the package's face
QUICK_LAUNCHES = (
    "tests/multirank/test_quickstart.py::test_quickstart_trains_on_two_ranks",      # horovodrun
    "tests/torchdist/test_torchrun.py::test_train_cli_under_torchrun_without_horovod",  # torchrun
)


def is_quick(item) -> bool:
    """Whether ``item`` is in the quick suite: every test that is neither ``multirank`` nor
    ``slow`` (the unit tests of every part), and the launches of :data:`QUICK_LAUNCHES`."""
    if item.nodeid in QUICK_LAUNCHES:
        return True
    return "multirank" not in item.keywords and "slow" not in item.keywords


@pytest.hookimpl(tryfirst=True)   # before ``-m`` deselects by the markers set here
def pytest_collection_modifyitems(config, items):
    has_gpu = _cuda_available()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (none visible to torch)")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)
        if is_quick(item):
            item.add_marker(pytest.mark.quick)
    # the unit tests first, while the fault launches run in the background (fault_launches);
    # then the multi-rank tests, in collection order
    items.sort(key=lambda item: "multirank" in item.keywords)


def _horovodrun_path() -> str | None:
    candidate = Path(sys.executable).with_name("horovodrun")
    if candidate.exists():
        return str(candidate)
    return shutil.which("horovodrun")


def _launch(cmd: list, cwd, paths: list, timeout: float, env: dict | None, check: bool,
            drop_prefix: str | None = None, stall: float | None = None, progress=None):
    """Run a launcher command (the ``horovodrun`` and ``torchrun`` fixtures): ``paths`` first on
    PYTHONPATH, one OpenMP thread per rank unless set, the environment variables starting with
    ``drop_prefix`` removed, then ``env``; fails the test with both streams on a non-zero exit
    when ``check``. It cannot hang on a rank's orphan (tests/launch_watch.py): past ``timeout``,
    or ``stall`` seconds without ``progress()`` moving, every process of the launch is killed
    and ``subprocess.TimeoutExpired`` raised."""
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    if drop_prefix:
        for k in [k for k in full_env if k.startswith(drop_prefix)]:
            del full_env[k]
    full_env["PYTHONPATH"] = os.pathsep.join(
        list(paths) + [p for p in full_env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if env:
        full_env.update(env)
    proc = run_watched(cmd, env=full_env, cwd=cwd, timeout=timeout, stall=stall,
                       progress=progress)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout}"
                    f"\n--- stderr\n{proc.stderr}")
    return proc


HVDRUN = Path(__file__).resolve().parent / "hvdrun.py"
_GLOO_BUILT: list = []


def gloo_built_once() -> bool:
    """Horovod's "was it built with Gloo" check (``horovod.common.util.gloo_built``), made once
    per session for every horovodrun launch (tests/hvdrun.py: horovodrun less that check), in a
    fresh interpreter: Horovod's check forks the calling process, and a pytest process whose
    earlier tests left threads and gloo groups behind (the thread-rank unit tests) crashes in
    the forked child."""
    if not _GLOO_BUILT:
        import subprocess
        import sys
        out = subprocess.run([sys.executable, "-c", "from horovod.common.util import gloo_built; "
                              "print(bool(gloo_built()))"], capture_output=True, text=True,
                             timeout=120)
        _GLOO_BUILT.append(out.stdout.strip().endswith("True"))
    return _GLOO_BUILT[0]


def _horovodrun_launcher(tmp_path):
    exe = _horovodrun_path()
    if exe is None:
        pytest.skip("horovod is not installed (run bash launch/setup.sh)")
    if not gloo_built_once():
        pytest.fail("Gloo support has not been built (horovod.common.util.gloo_built() is "
                    "False): reinstall Horovod with HOROVOD_WITH_GLOO=1 (launch/setup.sh)")

    def run(np: int, script: str | os.PathLike, *args: str, timeout: float = 180.0,
            env: dict | None = None, check: bool = True, **watch):
        # horovodrun's own code (tests/hvdrun.py), its Gloo check made once above
        cmd = [sys.executable, str(HVDRUN), "--gloo", "-np", str(np), "-H", f"localhost:{np}",
               "--network-interface", "lo", sys.executable, str(script), *map(str, args)]
        return _launch(cmd, tmp_path, [str(REPO_ROOT), str(TESTS)], timeout, env, check, **watch)

    return run


@pytest.fixture
def horovodrun(tmp_path):
    """Run ``python SCRIPT ARGS`` on N local gloo ranks (gloo pinned to ``lo``); returns the
    CompletedProcess.

    Usage: ``horovodrun(np, script, *args, timeout=120)``. The script's ranks should exit
    non-zero on failure; the fixture fails the test with both streams when they do.
    """
    return _horovodrun_launcher(tmp_path)


HIDDEN_HOROVOD = "raise ImportError('horovod is hidden from this run (tests/conftest.py torchrun)')\n"


@pytest.fixture
def torchrun(tmp_path):
    """Run ``python SCRIPT ARGS`` on N local ranks under ``torchrun --standalone`` (gloo, the
    torch engine, pinned to ``lo`` by ``GLOO_SOCKET_IFNAME`` unless ``env`` sets it); returns
    the CompletedProcess.

    Usage: ``torchrun(np, script, *args, timeout=120, hide_horovod=True)``. With
    ``hide_horovod`` a ``horovod`` package that raises ImportError comes first on the ranks'
    PYTHONPATH, so the run proves it needs no Horovod. Fails the test with both streams when a
    rank exits non-zero (``check``)."""
    return _torchrun_launcher(tmp_path)


def _torchrun_launcher(tmp_path):
    try:
        import torch.distributed as dist
    except ImportError:
        pytest.skip("torch.distributed is not available")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed has no gloo backend")

    def run(np: int, script: str | os.PathLike, *args: str, timeout: float = 180.0,
            env: dict | None = None, check: bool = True, hide_horovod: bool = True, **watch):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(np), "--monitor-interval", "0.5", "--tee", "3", str(script),
               *map(str, args)]
        paths = [str(REPO_ROOT), str(TESTS)]
        if hide_horovod:
            hide = tmp_path / "hidden-horovod"
            (hide / "horovod").mkdir(parents=True, exist_ok=True)
            (hide / "horovod" / "__init__.py").write_text(HIDDEN_HOROVOD)
            paths.insert(0, str(hide))
        return _launch(cmd, tmp_path, paths, timeout, {"GLOO_SOCKET_IFNAME": "lo", **(env or {})},
                       check, drop_prefix="HOROVOD_", **watch)

    return run


class ModeRun:
    """One entry's share of a grouped launch (:func:`launch_group`), read like the
    CompletedProcess of its own launch: ``stdout`` / ``stderr`` are what its script printed on
    every rank (rank 0's lines first, then rank 1's, ...), ``returncode`` is 0 when it finished
    on every rank and the optimizers it left were closed without error (its process would have
    exited 0), else non-zero. ``cwd`` is the folder it ran in; ``launch`` the whole launch's
    CompletedProcess, ``args`` its command."""

    def __init__(self, key, np_, files, launch, last):
        self.key, self.launch, self.stopped_in, self.cwd = key, launch, None, files
        self.args = launch.args
        outs, errs, self.done = [], [], {}
        for r in range(np_):
            out, err, done = (files.with_name(f"{files.name}.rank{r}.{x}")
                              for x in ("out", "err", "done"))
            outs.append(out.read_text() if out.exists() else "")
            errs.append(err.read_text() if err.exists() else "")
            if done.exists():
                self.done[r] = int(done.read_text() or 1)
        self.stdout, self.stderr = "".join(outs), "".join(errs)
        self.finished = len(self.done) == np_
        self.returncode = max(self.done.values()) if self.finished else (launch.returncode or 1)
        if self.finished and last and self.returncode == 0:
            self.returncode = launch.returncode   # the process's own exit follows the last entry

    def report(self) -> str:
        head = (f"[{self.key}] finished on ranks {sorted(self.done)}; the launch exited "
                f"{self.launch.returncode}"
                + (f" and stopped in [{self.stopped_in}]" if self.stopped_in else "")
                + f": {' '.join(map(str, self.launch.args))[:300]}")
        return (f"{head}\n--- stdout ({self.key})\n{self.stdout}\n--- stderr ({self.key})\n"
                f"{self.stderr}\n--- launch stderr (tail)\n{self.launch.stderr[-6000:]}")


class Group:
    """What :func:`launch_group` returns: ``group[key]`` is that entry's :class:`ModeRun`;
    ``group.ran(key)`` the same, failing the test (with the entry's streams) unless it finished
    on every rank with status 0, as the ``horovodrun`` / ``torchrun`` fixtures' ``check``."""

    def __init__(self, runs: dict):
        self.runs = runs

    def __getitem__(self, key) -> ModeRun:
        if key not in self.runs:
            pytest.fail(f"[{key}] was not part of this launch (not selected?)")
        return self.runs[key]

    def ran(self, key) -> ModeRun:
        run = self[key]
        if run.returncode != 0:
            pytest.fail(f"[{key}] did not end cleanly on every rank\n{run.report()}")
        return run


RUN_MODES = Path(__file__).resolve().parent / "run_modes.py"


def _newest_write(folder: Path) -> float:
    """The time of the newest write under ``folder`` (its files and folders), or 0."""
    newest = 0.0
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            try:
                newest = max(newest, os.stat(os.path.join(root, name)).st_mtime)
            except OSError:
                continue
    return newest


def _selected(session) -> tuple[set, list]:
    """The session's selected tests as ``{(module name, test name)}`` and their modules in
    collection order: what :func:`launch_group` and :func:`fault_launches` read the modules'
    ``LAUNCH_GROUPS`` / ``FAULT_LAUNCHES`` against (so ``pytest -k`` launches only what runs)."""
    wanted, modules = set(), []
    for item in session.items:
        mod = getattr(item, "module", None)
        if mod is None:
            continue
        wanted.add((mod.__name__, getattr(item, "originalname", item.name)))
        if mod not in modules:
            modules.append(mod)
    return wanted, modules


ENTRY_TIMEOUT = 300   # seconds, per entry of a grouped launch (the longest single-test timeout)


@pytest.fixture(scope="session")
def launch_group(tmp_path_factory):
    """``launch_group(request, launcher, np)``: the :class:`Group` of the requesting module's
    entries for ``(launcher, np)``, run in ONE launch shared by every test module of the session.

    A test module lists its entries in ``LAUNCH_GROUPS = [(launcher, np, entries), ...]`` (a
    fourth item ``"last"``: after the others, e.g. a script that ends with ``hvd.shutdown()``):
    ``launcher`` is ``"horovodrun"`` or ``"torchrun"``, each entry ``(key, test_name, script,
    args)``, run as ``python script *args`` would be, by tests/run_modes.py: one after the other
    on the same ranks, each in a fresh working folder (``ModeRun.cwd``), its output kept apart
    (a key names an entry within its module; a script ``"-m MODULE"`` runs as ``python -m
    MODULE``). ``args`` may be a callable: ``args(cwd)`` gives them, after making what the run
    reads in its working folder. The first test that asks for
    ``(launcher, np)`` starts the launch with the entries of every selected test of every
    collected module (so ``pytest -k`` runs only what it needs), in collection order; later
    tests read their entry's output. So the session pays the launcher's start-up (8-11 s on 2
    cores) once per launcher and world size instead of once per test. An entry that runs past
    ``ENTRY_TIMEOUT`` seconds ends the launch with its ranks' tracebacks. Runs that kill or hang
    a rank, or that stop every rank, keep a launch each, run side by side
    (:func:`fault_launches`); those that check their process's own exit keep their own launch
    (the horovodrun / torchrun fixtures)."""
    launches: dict = {}

    def start(session, launcher, np):
        wanted, modules = _selected(session)
        entries = [(mod.__name__, key, script, args, "last" in how)
                   for mod in modules for lau, n, group, *how in getattr(mod, "LAUNCH_GROUPS", ())
                   if (lau, n) == (launcher, np)
                   for key, test, script, args in group if (mod.__name__, test) in wanted]
        entries = [e[:4] for e in sorted(entries, key=lambda e: e[4])]   # "last" ones at the end
        tmp = tmp_path_factory.mktemp(f"group-{launcher}-np{np}")
        out = tmp / "modes"
        spec = []
        for i, (mod, key, script, args) in enumerate(entries):
            work = out / str(i)
            work.mkdir(parents=True)
            if callable(args):   # made in the entry's working folder, before the launch
                args = args(work)
            spec.append([f"{mod}:{key}", str(script), [str(a) for a in args]])
        make = _horovodrun_launcher if launcher == "horovodrun" else _torchrun_launcher
        # a launch that writes nothing into its entries' folders for longer than an entry may
        # run is stuck (e.g. a rank's orphan holds its output open): killed, not waited for
        proc = make(tmp)(np, RUN_MODES, out, json.dumps(spec), ENTRY_TIMEOUT,
                         timeout=120 + ENTRY_TIMEOUT * len(spec), check=False,
                         stall=ENTRY_TIMEOUT + 90, progress=lambda: _newest_write(out))
        (tmp / "launch.out").write_text(proc.stdout)   # kept for a look after a failure
        (tmp / "launch.err").write_text(proc.stderr)
        runs = {(mod, key): ModeRun(f"{mod}:{key}", np, out / str(i), proc,
                                    i == len(entries) - 1)
                for i, (mod, key, _, _) in enumerate(entries)}
        stopped = next((r.key for r in runs.values() if not r.finished), None)
        for r in runs.values():
            r.stopped_in = stopped
        return runs

    def run(request, launcher: str, np: int) -> Group:
        if (launcher, np) not in launches:
            try:
                launches[launcher, np] = start(request.session, launcher, np)
            except subprocess.TimeoutExpired as err:   # once: the later tests say so at once
                launches[launcher, np] = f"the {launcher} -np {np} launch timed out: {err}"
        if isinstance(launches[launcher, np], str):
            pytest.fail(launches[launcher, np])
        name = request.module.__name__
        return Group({key: r for (mod, key), r in launches[launcher, np].items() if mod == name})

    return run


def _group_fixture(launcher: str, np: int):
    """The module-scoped fixture ``hvd{np}`` / ``torch{np}``: the requesting module's
    :class:`Group` of the session's ``(launcher, np)`` launch (:func:`launch_group`)."""
    name = f"{'hvd' if launcher == 'horovodrun' else 'torch'}{np}"

    def group(launch_group, request) -> Group:
        return launch_group(request, launcher, np)
    group.__doc__ = (f"The requesting module's entries of the session's ``{launcher} -np {np}`` "
                     f"launch (its ``LAUNCH_GROUPS``), a :class:`Group`.")
    return pytest.fixture(scope="module", name=name)(group)


#: a test module's share of a grouped launch, by launcher and world size: a test asks for
#: ``hvd3`` (horovodrun -np 3) or ``torch2`` (torchrun -np 2) and reads ``hvd3.ran(key)``
hvd2, hvd3, hvd4 = (_group_fixture("horovodrun", n) for n in (2, 3, 4))
torch2, torch3, torch4 = (_group_fixture("torchrun", n) for n in (2, 3, 4))


#: how many fault launches run at once (:func:`fault_launches`): they spend much of their time
#: waiting for a timeout to name a rank, so two run beside the unit tests on 2 cores
FAULT_CONCURRENCY = 2
#: how much lower the unit tests' priority is than the fault launches' while these run
#: (:func:`_yield_to_fault_launches`)
UNIT_NICE = 10
#: the session's fault launches, which the first multi-rank test waits for
#: (:func:`pytest_runtest_setup`)
_FAULT_FUTURES: list = []
_NICED: list = []


def _yield_to_fault_launches() -> None:
    """The unit tests run at a lower priority than the fault launches beside them: a fault
    launch's checks read how its ranks saw a timeout (which rank the census names, whether the
    control rounds kept coming), and a survivor starved for seconds by the unit tests' CPU
    says something else (seen: a census that named a live rank, a rank said frozen that was
    only slow). Linux keeps the nice value per thread, and a child process takes its forking
    thread's: so only pytest's main thread (the unit tests and what they start) goes down; the
    launcher threads, made before, and their ranks stay where they were."""
    if not _NICED and hasattr(os, "nice"):
        os.nice(UNIT_NICE)
        _NICED.append(UNIT_NICE)


def pytest_runtest_setup(item):
    """A multi-rank test starts once the fault launches have ended: they overlap the unit tests
    only, never a launch whose checks time a step or a fault (one elastic kill, noticed within
    10 s alone, waited for the 60 s timeout once beside them). Then the main thread's priority
    goes back up where the system allows (root); else every launch runs at the lowered one,
    with nothing beside it."""
    if "multirank" in item.keywords:
        while _FAULT_FUTURES:
            _FAULT_FUTURES.pop().exception()   # waits; its outcome is read by its own test
        while _NICED:
            try:
                os.nice(-_NICED.pop())
            except OSError:
                pass


@pytest.fixture(scope="session", autouse=True)
def fault_launches(tmp_path_factory, request):
    """``fault_launches(request, key)``: the CompletedProcess of the requesting module's fault
    launch ``key`` (its exit status not checked), one of the session's fault launches, run in
    the background.

    A run that kills or hangs a rank, or stops every rank with an error, keeps a launch of its
    own (it cannot be an entry of :func:`launch_group`'s shared launch), and most of its time
    is spent waiting for a timeout to name the rank. So the session starts every selected
    module's fault launches when its first test starts, ``FAULT_CONCURRENCY`` at a time in
    background threads, while the unit tests run (they come first:
    :func:`pytest_collection_modifyitems` puts the multi-rank tests last, and the first of them
    waits until every fault launch has ended: :func:`pytest_runtest_setup`). A module lists
    them in ``FAULT_LAUNCHES = [(launcher, np, key, test_name, script, args), ...]``
    (``launcher`` ``"horovodrun"`` or ``"torchrun"``; ``args`` as the script's command
    line; each launch in a folder of its own, 180 s at most)."""
    from concurrent.futures import ThreadPoolExecutor

    results: dict = {}
    wanted, modules = _selected(request.session)
    jobs = []
    for mod in modules:
        for launcher, np_, key, test, script, args in getattr(mod, "FAULT_LAUNCHES", ()):
            if (mod.__name__, test) not in wanted:
                continue
            tmp = tmp_path_factory.mktemp(f"fault-{key}")
            make = _horovodrun_launcher if launcher == "horovodrun" else _torchrun_launcher
            try:
                run = make(tmp)
            except pytest.skip.Exception as why:   # e.g. horovod not installed
                results[mod.__name__, key] = f"skip:{why}"
                continue
            jobs.append(((mod.__name__, key), run, np_, script, args))

    def one(run, np_, script, args, key):
        try:
            return run(np_, script, *args, timeout=180, check=False)
        except subprocess.TimeoutExpired as err:
            return f"fail:the fault launch {key!r} timed out: {err}\n{err.output}"

    pool = ThreadPoolExecutor(max_workers=FAULT_CONCURRENCY, thread_name_prefix="fault-launch")
    for name, run, np_, script, args in jobs:
        results[name] = pool.submit(one, run, np_, script, args, name[1])
        _FAULT_FUTURES.append(results[name])
    if jobs:   # the pool's threads exist now (one per submitted job, up to its size)
        _yield_to_fault_launches()

    def get(request, key):
        name = (request.module.__name__, key)
        if name not in results:
            pytest.fail(f"fault launch {key!r} is not in {request.module.__name__}'s "
                        f"FAULT_LAUNCHES (or its test was not selected)")
        res = results[name]
        res = res if isinstance(res, str) else res.result()
        if isinstance(res, str):
            (pytest.skip if res.startswith("skip:") else pytest.fail)(res.split(":", 1)[1])
        return res

    yield get
    pool.shutdown(wait=True)


@pytest.fixture
def fault(fault_launches, request):
    """``fault(key)``: the CompletedProcess of this module's fault launch ``key``
    (:func:`fault_launches`)."""
    return lambda key: fault_launches(request, key)


@pytest.fixture
def usage_error(capsys):
    """``usage_error(main, argv)``: runs a command-line ``main`` that must stop with an argparse
    usage error (exit status 2) and returns what it printed on stderr."""
    def run(main, argv):
        with pytest.raises(SystemExit) as err:
            main(argv)
        assert err.value.code == 2, f"exit status {err.value.code}, not a usage error"
        return capsys.readouterr().err
    return run


@pytest.fixture
def unusable_runs(tmp_path):
    """``[(argv after --out, message), ...]``: run folders (and a replay: trace) that pgc-hvd
    train and simulate must refuse before the run, with the message each gets."""
    a_file = tmp_path / "file"
    a_file.write_text("not a folder")
    (tmp_path / "r" / "records.jsonl").mkdir(parents=True)
    (tmp_path / "s" / "summary.json").mkdir(parents=True)
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "records.jsonl").write_text('{"step": 0, "time": 0.1}\n')
    trace = tmp_path / "trace.json"
    trace.write_text('{"format": "pgc_hvd.delay_trace/1", "delays": [[0, 0, -1.0]]}')
    return [([str(a_file)], "is a file; --out names the run's folder"),
            ([str(tmp_path / "r")], "records.jsonl is a folder"),
            ([str(tmp_path / "s")], "summary.json is a folder"),
            ([str(tmp_path / "done")], "already holds an earlier run"),
            ([str(tmp_path / "new"), "--delay", f"replay:{trace}"],
             "trace.json, entry 0 ([0, 0, -1.0]): the delay must be finite seconds >= 0")]


def pytest_sessionfinish(session, exitstatus):
    """The session fails when a test left a package thread running (:func:`leftover_threads`),
    naming it, instead of the interpreter aborting at its exit."""
    alive = leftover_threads()
    if alive:
        names = ", ".join(sorted(t.name for t in alive))
        session.config.get_terminal_writer().line(
            f"\nERROR: package threads still running at the session's end: {names}. A test "
            "started an optimizer or a control channel and never closed it: close the "
            "optimizer (opt.close()) or stop the part (request_stop()) at the test's end.",
            red=True)
        if session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
