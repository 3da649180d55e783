"""A real single-node Slurm on 127.0.0.1 for tests: munged, slurmctld and slurmd started from a tmp dir.

Debian's ``slurm-wlm`` and ``munge`` (``recipes/tools/install_system_packages.sh`` installs them) run
without systemd: a private munge key and socket, a ``slurm.conf`` with ports the OS picked (other
Slurms on the machine are untouched), state, spool, pid and log files under the tmp dir. The daemons
run in the foreground as children of the test process, so :meth:`SlurmCluster.stop` ends exactly
what :meth:`SlurmCluster.start` started (jobs first, with ``scancel``). Clients find the cluster
through ``SLURM_CONF`` (:attr:`SlurmCluster.env`). The daemons need root (``slurmd`` launches jobs
as their users); :func:`skip_reason` says why a machine cannot run them.

What is known to work on a loopback-only Debian machine: /work/shared/notes/slurm-on-loopback.md.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.conftest import hang_limit

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol")


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")


def skip_reason() -> str | None:
    """Why this machine cannot start the daemons (not root, packages missing), or None."""
    if os.geteuid() != 0:
        return "starting slurmd and munged needs root (CI runs the tests as root)"
    missing = [name for name in DAEMONS + CLIENTS if _which(name) is None]
    if missing:
        return (f"{', '.join(missing)} not installed: run recipes/tools/install_system_packages.sh "
                f"(apt-get install slurm-wlm munge)")
    return None


def _free_ports(n: int) -> list[int]:
    import socket

    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SlurmCluster:
    """One node (``localhost``, ``cpus`` CPUs) in one partition ``debug``, managed from ``root``."""

    def __init__(self, root: Path, cpus: int = 4):
        self.root = Path(root)
        self.cpus = cpus
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = self.root / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self._logs: list = []

    # ------------------------------------------------------------------ start / stop

    def start(self, timeout: float = 60) -> SlurmCluster:
        try:
            self._start_munge(timeout)
            self._write_conf()
            self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._spawn("slurmd", [_which("slurmd"), "-D", "-N", "localhost", "-f", str(self.conf)])
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self, timeout: float) -> None:
        munge = self.root / "munge"
        munge.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = munge / "munge.socket"
        self._spawn("munged", [_which("munged"), "--foreground", "--force", f"--key-file={key}",
                               f"--socket={self.munge_socket}", f"--pid-file={munge / 'munged.pid'}",
                               f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'munged.seed'}",
                               "--num-threads=2"])
        self._until(lambda: self.munge_socket.exists(), timeout, "munged did not create its socket")

    def _write_conf(self) -> None:
        ctld_port, slurmd_port = _free_ports(2)
        r = self.root
        for d in ("state", "spool"):
            (r / d).mkdir(exist_ok=True)
        self.conf.write_text("\n".join([
            "ClusterName=corpusio",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
            "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "MpiDefault=none",
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            "SlurmdParameters=config_overrides",  # the node may claim more CPUs than this machine has
            "ReturnToService=2",
            "CommunicationParameters=EnableIPv6",  # loopback-only hosts: getaddrinfo(AI_ADDRCONFIG) fails
            "MinJobAge=300",  # finished jobs stay visible to squeue/scontrol for the test
            "KillWait=2",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "",
        ]))

    def _spawn(self, name: str, argv: list) -> None:
        log = open(self.root / f"{name}.out", "wb")
        self._logs.append(log)
        self.procs[name] = subprocess.Popen([str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT,
                                            env=self.env, start_new_session=True)

    def _until(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + hang_limit(timeout)
        while not ready():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"{what} ({'exited: ' + ', '.join(dead) if dead else 'timeout'}).\n"
                                   f"{self.logs()}")
            time.sleep(0.2)

    def _wait_idle(self, timeout: float) -> None:
        def idle() -> bool:
            out = self.client("sinfo", "-h", "-o", "%T", check=False).stdout.strip()
            return out in ("idle", "mixed", "allocated")

        self._until(idle, timeout, "the Slurm node did not become idle")

    def stop(self) -> None:
        """Cancel every job, then stop slurmd, slurmctld and munged (the processes this object started)."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.client("scancel", "--full", "--user", "root", check=False)
            deadline = time.monotonic() + 15
            while self.client("squeue", "-h", check=False).stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.3)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for log in self._logs:
            log.close()
        self._logs = []

    # ------------------------------------------------------------------ clients

    def client(self, name: str, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        result = subprocess.run([_which(name), *args], capture_output=True, text=True, env=self.env,
                                timeout=hang_limit(timeout))
        if check and result.returncode != 0:
            raise RuntimeError(f"{name} {' '.join(args)} failed ({result.returncode}): {result.stderr}\n"
                               f"{self.logs()}")
        return result

    def sbatch(self, *args: str) -> str:
        """Submit (``--parsable``); the job id."""
        return self.client("sbatch", "--parsable", *args).stdout.strip().split(";")[0]

    def job_states(self, job: str) -> dict[str, str]:
        """``{job id (array tasks as 12_3): state}`` of a job and its array tasks, while Slurm remembers them."""
        out = self.client("squeue", "-h", "-t", "all", "-j", job, "-o", "%i %T", "-r", check=False).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def wait(self, job: str, timeout: float = 120, *, until=("COMPLETED",)) -> dict[str, str]:
        """Wait until every task of ``job`` left the queue; their final states."""
        finished = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                    "BOOT_FAIL", "DEADLINE"}
        limit = hang_limit(timeout)
        deadline = time.monotonic() + limit
        while True:
            states = self.job_states(job)
            if states and all(s in finished for s in states.values()):
                return states
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job} not done in {limit:.0f} s: {states}\n{self.logs()}")
            time.sleep(0.3)

    def logs(self, tail: int = 3000) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log", "munge/munged.log", "slurmctld.out", "slurmd.out", "munged.out"):
            p = self.root / name
            if p.is_file():
                parts.append(f"--- {name} ---\n{p.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)
