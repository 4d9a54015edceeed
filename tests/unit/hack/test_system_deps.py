"""hack/system-deps: the Debian packages `make test` installs for itself, read from dpkg's database.

The script's view of the machine comes from dpkg-query, which honours DPKG_ADMINDIR: the tests point it at small real
dpkg databases (empty, complete, a package removed with its configuration kept) instead of changing this machine.
Nothing here runs apt-get: the only runs as root are ones where nothing is missing or `--check`.
"""

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "hack" / "system-deps"
# What `make test` needs on a fresh Debian 12 machine: the entry points, chromium (report screenshot), the real test
# fleet's tools, promtool and node_exporter for the monitoring, Alertmanager and Java 17 (ansible-rulebook) for the
# alert path, stress-ng for make test-stress, Open MPI and perftest for the fabric, a real Slurm for the lifecycle.
EXPECTED = ["make", "git", "chromium", "debootstrap", "systemd-container", "iproute2", "openssh-client", "procps",
            "dpkg-dev", "apt-utils", "prometheus", "prometheus-node-exporter", "prometheus-alertmanager",
            "openjdk-17-jre-headless", "stress-ng", "openmpi-bin", "python3-mpi4py", "perftest", "slurmctld", "slurmd",
            "slurm-client", "munge"]

pytestmark = pytest.mark.skipif(not shutil.which("dpkg-query"), reason="not a dpkg-based machine")


@pytest.fixture
def tmp_path():
    """Readable by nobody too (pytest's own tmp_path is under a 0700 directory)."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-system-deps-") as d:
        os.chmod(d, 0o755)
        yield Path(d)


def dpkg_db(path, installed=(), config_files=()):
    """A dpkg admin dir whose status file lists `installed` as installed and `config_files` as removed-but-configured."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o755)
    stanzas = ["Package: %s\nStatus: %s\nVersion: 1.0\nArchitecture: all\nMaintainer: test\nDescription: test\n"
               % (name, status)
               for names, status in ((installed, "install ok installed"), (config_files, "deinstall ok config-files"))
               for name in names]
    (path / "status").write_text("\n".join(stanzas))
    return path


def run(*args, admindir=None, as_nobody=False):
    env = dict(os.environ)
    if admindir is not None:
        env["DPKG_ADMINDIR"] = str(admindir)
    argv = [str(SCRIPT), *args]
    if as_nobody and os.geteuid() == 0:
        argv = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)


def test_list_is_the_make_test_expectation():
    r = run("--list")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == EXPECTED


def test_check_on_an_empty_machine_lists_everything_it_would_install(tmp_path):
    r = run("--check", admindir=dpkg_db(tmp_path / "db"))
    assert r.returncode == 1, r.stderr
    assert r.stdout.split() == EXPECTED


def test_a_package_removed_with_its_configuration_kept_is_missing(tmp_path):
    # `dpkg -s` exits 0 for such a package; the script must not take it for installed.
    db = dpkg_db(tmp_path / "db", installed=[p for p in EXPECTED if p != "stress-ng"], config_files=["stress-ng"])
    r = run("--check", admindir=db)
    assert (r.returncode, r.stdout.split()) == (1, ["stress-ng"])


def test_check_agrees_with_dpkg_on_this_machine():
    truly_missing = [p for p in EXPECTED
                     if subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Status}", p],
                                       capture_output=True, text=True).stdout != "installed"]
    r = run("--check")
    assert r.stdout.split() == truly_missing
    assert r.returncode == (1 if truly_missing else 0)


def test_nothing_missing_is_a_silent_no_op_even_without_root(tmp_path):
    db = dpkg_db(tmp_path / "db", installed=EXPECTED)
    for as_nobody in (False, True):
        r = run(admindir=db, as_nobody=as_nobody)
        assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_without_root_it_stops_and_names_the_command(tmp_path):
    db = dpkg_db(tmp_path / "db", installed=EXPECTED[:-2])
    r = run(admindir=db, as_nobody=True)
    assert r.returncode == 1 and r.stdout == ""
    assert "not installed: %s" % " ".join(EXPECTED[-2:]) in r.stderr
    assert "sudo %s" % SCRIPT in r.stderr


def test_unknown_argument_is_refused():
    assert run("--install-everything").returncode == 2


def test_make_test_runs_it_first_and_ci_runs_only_make_test():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^system-deps:\n\thack/system-deps$", makefile, re.M)
    # make test prepares everything first (test-setup, at once), the packages among it, then runs the suites.
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.M).group(1).splitlines()
    assert "test-setup" in recipe[0].split() and "run-suites" in recipe[-1], recipe
    assert re.search(r"^test-setup:(.*)$", makefile, re.M).group(1).split()[0] == "system-deps"
    assert "system-deps" in re.search(r"^fleet-cache:(.*)$", makefile, re.M).group(1).split()
    assert "system-deps" in re.search(r"^test-fleet:(.*)$", makefile, re.M).group(1).split()
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert "make test" in ci
    assert not [line for line in ci if re.search(r"apt-get|dpkg|apt ", line)], ci
