"""Workers sharing one study through PostgreSQL (Optuna RDB storage with heartbeats).

Starts a throw-away PostgreSQL server (Debian package ``postgresql``: ``initdb``/``pg_ctl``) in a
temporary folder, runs two workers against it, kills one mid-trial (making it look like a worker of
another machine, so only Optuna's heartbeat can tell it is dead), and checks that every cell
completes exactly once. Skipped when the server binaries or ``psycopg2`` are missing.
"""

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest
from optuna.trial import TrialState
from test_workers import cells_of, completed_once, tiny_plan, wait_running  # noqa: E402  (tests/experiments on sys.path)

from experiments.sweeps.presets import build_specs
from experiments.sweeps.study import GridStudy, cell_id
from experiments.sweeps.workers import start_worker

pytest.importorskip("psycopg2", reason="psycopg2 is not installed (pip install 'expressivity-suite[postgres]')")


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found if isinstance(found, str) else (found[-1] if found else None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url(tmp_path_factory):
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install -y postgresql")
    root = tmp_path_factory.mktemp("pg")
    prefix: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root: use the package's 'postgres' user
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the server")
        os.chown(root, user.pw_uid, user.pw_gid)
        os.chmod(root, 0o755)
        for parent in root.parents:  # the server user must reach its folder
            if str(parent).startswith(("/tmp", str(tmp_path_factory.getbasetemp()))):
                os.chmod(parent, os.stat(parent).st_mode | 0o011)
        prefix = ["runuser", "-u", "postgres", "--"] if shutil.which("runuser") else ["su", "postgres", "-c"]
    data, port = root / "data", _free_port()

    def run(*cmd):
        full = [*prefix, *cmd] if prefix[:1] != ["su"] else [*prefix, " ".join(map(str, cmd))]
        return subprocess.run(full, capture_output=True, text=True, timeout=120)

    made = run(initdb, "-D", data, "-A", "trust", "-U", "suite", "--no-sync")
    if made.returncode:
        pytest.skip(f"initdb failed: {made.stderr.strip().splitlines()[-1:]}")
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"
    started = run(pg_ctl, "-D", data, "-o", opts, "-l", root / "server.log", "-w", "-t", "60", "start")
    if started.returncode:
        pytest.skip(f"pg_ctl start failed: {started.stderr.strip() or (root / 'server.log').read_text()[-500:]}")
    try:
        yield f"postgresql://suite@127.0.0.1:{port}/postgres"
    finally:
        run(pg_ctl, "-D", data, "-m", "immediate", "stop")


@pytest.mark.slow
def test_two_workers_on_postgres_one_killed_every_cell_once(postgres_url, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    plan = tiny_plan(["test_workers:SlowMixer"], seeds=[0, 1, 2, 3], max_steps=40)
    specs = build_specs(plan)
    stale_timeout = 6  # Optuna's grace period: a silent trial is failed and retried after 6 s
    grid = GridStudy.open(postgres_url, tmp_path, "pg-sweep", stale_timeout)
    assert grid.sync(cells_of(specs))["queued"] == 4
    workers = [
        start_worker(i, cells_of(specs), "pg-sweep", postgres_url, tmp_path / f"machine{i}", "cpu", stale_timeout)
        for i in range(2)
    ]
    victim = wait_running(grid)
    # pretend the victim runs on another machine: only its (Optuna) heartbeat can show that it died
    grid.storage.set_trial_system_attr(
        grid.trial_id(victim), "worker", {"host": "another-machine", "pid": 1, "id": "x"}
    )
    pid = next(p for p in workers if p.pid == victim.system_attrs["worker"]["pid"])
    os.kill(pid.pid, signal.SIGKILL)
    survivor = next(p for p in workers if p is not pid)
    survivor.join(240)
    assert survivor.exitcode == 0, (tmp_path / "machine0" / "workers").glob("*")
    trials = completed_once(grid, specs)
    dead = grid.storage.get_trial(grid.trial_id(victim))
    assert dead.state == TrialState.FAIL
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == victim.number]
    assert (
        len(retries) == 1 and retries[0].state == TrialState.COMPLETE
    )  # RetryHeartbeatStaleTrialCallback's copy, with the cell's parameters
    assert (
        retries[0].user_attrs["cell"]
        == victim.user_attrs["cell"]
        == cell_id(next(s for s in specs if cell_id(s) == victim.user_attrs["cell"]))
    )
    assert retries[0].params == victim.params
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 4
