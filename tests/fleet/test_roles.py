"""The provisioning roles for real, on test-fleet nodes (systemd, apt, SSH), with stand-in NVIDIA packages.

Fleets of their own (prefix gpfr<i>), so the simulator package the other fleet tests install never meets the stand-in
nvidia-smi/dcgmi packages (dpkg would refuse the file conflict): one single-node fleet per node story, each its own
pytest-xdist group, so the stories run at once. node0 takes the playbook with the molecule scenarios'
variables: check mode on the fresh node (no change, no failure), converge, idempotence (changed=0), then every role's
molecule verify.yml. node1 takes the bad inputs first (nothing installed), then non-default variables. node2 and node3
follow NVIDIA's driver branches through a repository update that adds branches 590 and 595 (NEWER_BRANCH_SPECS):
a node pinned to 580 stays on 580, branch 590 installs under NVIDIA's post-590 package names, branch 595 (no pinning
package in the mirror) is refused.

Run: `pytest -q -m fleet tests/fleet/test_roles.py` as root. Also usable by molecule's create/destroy playbooks:
`python tests/fleet/test_roles.py keep --dir D` keeps a 1-node fleet up until `D/stop` appears.
"""

import os
import re
import shutil
import sys
import textwrap
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import aptrepo  # noqa: E402
import harness  # noqa: E402
from fleet_ansible import PlaybookRun  # noqa: E402

ROLES = ["nvidia_driver", "dcgm", "dcgm_exporter", "gpufleet_node_exporter", "training_env", "validation_tools"]
FLEET_DIR = Path(os.environ.get("GPUFLEET_ROLES_FLEET_DIR", "/var/tmp/gpufleet-roles-fleet"))
# Not in the first repository: added mid-module, as an update of NVIDIA's repository (tests/fleet/packages/README.md).
NEWER_BRANCH_SPECS = ("nvidia-open@590", "nvidia-driver-pinning-590", "nvidia-smi@590", "nvidia-persistenced@590",
                      "nvidia-open@595", "nvidia-smi@595", "nvidia-persistenced@595")
DRIVER_CONVERGE = REPO / "roles/nvidia_driver/molecule/default/converge.yml"
MIRROR = "/var/tmp/mirror/gpufleet-prebuilt.tar.gz"

# The molecule scenarios' variables (roles/*/molecule/default/converge.yml), for the whole playbook at once.
DEFAULT_VARS = """
nvidia_driver_cuda_repo_url: file:/srv/gpufleet-apt/
nvidia_driver_cuda_repo_trusted: true
nvidia_driver_kernel_headers: false
validation_tools_install_method: prebuilt
validation_tools_prebuilt_url: file://{mirror}
validation_tools_prebuilt_checksum: "sha256:{checksum}"
training_env_checkpoint_dir: /srv/ckpt
"""

pytestmark = pytest.mark.fleet


def build_fleet(dir, nodes, prefix, subnet):
    base = harness.ensure_base()
    fleet = harness.Fleet(dir=Path(dir), nodes_wanted=nodes, prefix=prefix, subnet=subnet)
    if fleet.state_path.exists():
        harness.Fleet.from_state(dir).down()
    shutil.rmtree(fleet.apt_dir, ignore_errors=True)
    first = [name for name in aptrepo.spec_names() if name not in NEWER_BRANCH_SPECS]
    aptrepo.build_repo(fleet.apt_dir, harness.DEFAULT_CACHE, base=base, sim=False, debian=aptrepo.DEBIAN_PACKAGES,
                       only=first)
    fleet.up(base=base)
    fleet.write_inventory(groups=("gpufleet_testfleet", "gpufleet_nodes"))
    return fleet


class Stories:
    """Node i's story runs on a one-node fleet of its own (prefix gpfr<i>, subnet 10.213.<20+i>, its own repository),
    built when a test first asks for it: the stories share nothing, so test workers run them at once."""

    def __init__(self):
        self.fleets = {}

    def fleet(self, i):
        if i not in self.fleets:
            started = time.monotonic()
            self.fleets[i] = build_fleet(FLEET_DIR / ("node%d" % i), 1, "gpfr%d" % i, "10.213.%d" % (20 + i))
            print("role fleet of node %d up in %.1f s" % (i, time.monotonic() - started))
        return self.fleets[i]

    def owner(self, name):
        return next(f for f in self.fleets.values() if f.nodes[0].name == name)


@pytest.fixture(scope="module")
def rfleet(fleet_base):
    stories = Stories()
    yield stories
    problems = [p for f in stories.fleets.values() for p in f.down() + f.leftovers()]
    assert not problems, problems


@pytest.fixture(scope="module")
def run(rfleet, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("roles")

    def _run(playbook, *extra, limit, timeout=420):
        args = list(extra) + ["--limit", limit]
        started = time.monotonic()
        r = PlaybookRun(rfleet.owner(limit), playbook, args, None, tmp).wait(timeout)
        r.duration_s = time.monotonic() - started
        print("%-60s %5.1f s rc=%s %s" % (" ".join([Path(str(playbook)).name] + args)[:60], r.duration_s,
                                          r.proc.returncode, r.recap))
        return r
    return _run


def node(rfleet, i):
    return rfleet.fleet(i).nodes[0].name


def sh(rfleet, i, cmd, check=True):
    return rfleet.fleet(i).ssh(node(rfleet, i), cmd, timeout=60, check=check)


def vars_file(rfleet, tmp_path, i, text):
    checksum = sh(rfleet, i, "sha256sum %s" % MIRROR).stdout.split()[0]
    path = tmp_path / ("vars-%d.yml" % i)
    path.write_text(textwrap.dedent(text).format(mirror=MIRROR, checksum=checksum))
    return path


def prepare(run, rfleet, i):
    """apt sees the repository; the prebuilt mirror archive exists (validation_tools' molecule prepare)."""
    sh(rfleet, i, "apt-get update -q")
    r = run(REPO / "roles/validation_tools/molecule/default/prepare.yml", limit=node(rfleet, i))
    assert r.proc.returncode == 0, r.output[-3000:]


@pytest.mark.xdist_group("roles-node0")
def test_check_mode_on_a_fresh_node_changes_nothing_and_fails_nothing(run, rfleet, tmp_path):
    prepare(run, rfleet, 0)
    before = sh(rfleet, 0, "dpkg -l | md5sum; ls /etc/apt/sources.list.d /etc/systemd/system | md5sum").stdout
    r = run(REPO / "playbooks/provision.yml", "--check", "-e", "@%s" % vars_file(rfleet, tmp_path, 0, DEFAULT_VARS),
            limit=node(rfleet, 0))
    assert r.proc.returncode == 0, r.output[-4000:]
    assert r.recap[node(rfleet, 0)]["failed"] == 0
    assert r.recap[node(rfleet, 0)]["changed"] > 0  # it did report what it would change
    assert sh(rfleet, 0, "dpkg -l | md5sum; ls /etc/apt/sources.list.d /etc/systemd/system | md5sum").stdout == before
    assert sh(rfleet, 0, "test -e /opt/gpufleet || test -e /etc/profile.d/gpufleet-training-env.sh",
              check=False).returncode == 1


@pytest.mark.xdist_group("roles-node0")
@pytest.mark.timeout(4 * 420 + 60)  # four playbook runs, each bounded by its own 420 s (708 s here, >900 s in a busy CI)
def test_converge_is_idempotent_and_every_role_verifies(run, rfleet, tmp_path):
    extra = ("-e", "@%s" % vars_file(rfleet, tmp_path, 0, DEFAULT_VARS))
    first = run(REPO / "playbooks/provision.yml", *extra, limit=node(rfleet, 0))
    assert first.proc.returncode == 0, first.output[-4000:]
    second = run(REPO / "playbooks/provision.yml", *extra, limit=node(rfleet, 0))
    assert second.proc.returncode == 0, second.output[-4000:]
    changed = [line for _, line in second.lines if line.startswith("changed:")]
    assert second.recap[node(rfleet, 0)]["changed"] == 0, "not idempotent: %s\n%s" % (changed, second.output[-3000:])
    # Check mode on the converged node: nothing to change either.
    check = run(REPO / "playbooks/provision.yml", "--check", *extra, limit=node(rfleet, 0))
    assert check.proc.returncode == 0 and check.recap[node(rfleet, 0)]["changed"] == 0, check.output[-3000:]
    # Every role's molecule verify in one ansible-playbook run (one start and one SSH connection, not six).
    verify_all = tmp_path / "verify-all.yml"
    verify_all.write_text("".join("- import_playbook: %s\n" % (REPO / "roles" / role / "molecule/default/verify.yml")
                                  for role in ROLES))
    v = run(verify_all, limit=node(rfleet, 0))
    assert v.proc.returncode == 0, "a role's verify failed:\n%s" % v.output[-3000:]
    assert v.recap[node(rfleet, 0)]["failed"] == 0 and v.recap[node(rfleet, 0)]["ok"] >= len(ROLES), v.recap


@pytest.mark.xdist_group("roles-node1")
def test_a_branch_missing_from_the_repository_is_refused_and_installs_nothing(run, rfleet, tmp_path):
    prepare(run, rfleet, 1)
    for branch, package in (("999", "nvidia-open"), ("560", "nvidia-open-560")):  # both namings
        r = run(DRIVER_CONVERGE, "-e", '{"nvidia_driver_branch": "%s"}' % branch, limit=node(rfleet, 1))
        assert r.proc.returncode != 0
        out = " ".join(r.output.split())
        assert ("driver branch %s is not in the configured repository file:/srv/gpufleet-apt/: it has no %s %s.x and no "
                "nvidia-driver-pinning-%s." % (branch, package, branch, branch)) in out, out[-3000:]
        # Pinning packages and metapackages of every naming: 570, 575 (metapackage only) and 580 at this point.
        assert "Branches it offers: 570, 575, 580." in out, out[-3000:]
    assert sh(rfleet, 1, "dpkg -l 'nvidia-*' 'cuda-drivers*' 2>/dev/null | grep -c '^ii'", check=False).stdout.strip() == "0"
    # Refused before any pin or package: only the repository entry (needed for the lookup) was written.
    assert sh(rfleet, 1, "ls /etc/apt/preferences.d").stdout.strip() == ""


@pytest.mark.xdist_group("roles-node1")
def test_a_download_whose_checksum_does_not_match_fails_and_installs_nothing(run, rfleet):
    r = run(REPO / "roles/validation_tools/molecule/default/converge.yml", "-e",
            '{"validation_tools_prebuilt_checksum": "sha256:%s"}' % ("0" * 64), limit=node(rfleet, 1))
    assert r.proc.returncode != 0
    assert "did not match 0000000000" in " ".join(r.output.split())  # get_url refused the file
    assert sh(rfleet, 1, "ls -A /opt/gpufleet/bin 2>/dev/null | wc -l").stdout.strip() == "0"


NON_DEFAULT_VARS = """
nvidia_driver_cuda_repo_url: file:/srv/gpufleet-apt/
nvidia_driver_cuda_repo_trusted: true
nvidia_driver_kernel_headers: false
nvidia_driver_version: "570.172.08"
nvidia_driver_pci_device_ids: ["1db6"]
dcgm_cuda_major: "12"
dcgm_expected_gpu_count: 8
dcgm_exporter_listen_address: "127.0.0.1:9500"
dcgm_exporter_extra_counters:
  - {{name: DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, type: counter, help: NVLink bandwidth}}
dcgm_exporter_verify_metrics: [DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, DCGM_EXP_XID_ERRORS_COUNT]
gpufleet_node_exporter_listen_address: ":9200"
gpufleet_node_exporter_textfile_directory: /srv/textfile
gpufleet_node_exporter_textfile_mode: "0775"
training_env_extra_vars: {{NCCL_DEBUG: WARN}}
training_env_vars:
  TORCH_NCCL_ASYNC_ERROR_HANDLING: "1"
  TORCH_NCCL_TRACE_BUFFER_SIZE: "50000"
training_env_targets: [profile, systemd]
training_env_deprecated_action: warn
training_env_checkpoint_dir: /srv/ckpt2
training_env_checkpoint_mode: "0700"
validation_tools_tools: [gpu_burn]
validation_tools_prefix: /opt/gf2
validation_tools_install_method: prebuilt
validation_tools_prebuilt_url: file://{mirror}
validation_tools_prebuilt_checksum: "sha256:{checksum}"
"""


@pytest.mark.xdist_group("roles-node1")
def test_non_default_variables(run, rfleet, tmp_path):
    # A V100-class GPU (proprietary modules), 8 GPUs, an older kernel module still loaded (reboot pending), and an old
    # image's deprecated variable that the operator wants flagged, not removed.
    sh(rfleet, 1, "mkdir -p /etc/gpufleet-standin && echo 8 > /etc/gpufleet-standin/gpu-count && "
                  "echo 550.54.14 > /etc/gpufleet-standin/loaded-driver-version && "
                  "echo NCCL_ASYNC_ERROR_HANDLING=1 >> /etc/environment")
    extra = ("-e", "@%s" % vars_file(rfleet, tmp_path, 1, NON_DEFAULT_VARS))
    r = run(REPO / "playbooks/provision.yml", *extra, limit=node(rfleet, 1))
    assert r.proc.returncode == 0, r.output[-4000:]
    out = " ".join(r.output.split())
    assert "REBOOT REQUIRED. NVIDIA driver 570.172.08 is installed but not running" in out
    assert "deprecated NCCL_ASYNC_ERROR_HANDLING still set in /etc/environment:" in out
    again = run(REPO / "playbooks/provision.yml", *extra, limit=node(rfleet, 1))
    assert again.recap[node(rfleet, 1)]["changed"] == 0, again.output[-3000:]

    state = sh(rfleet, 1, "; ".join([
        "dpkg-query -W -f='${Package}=${Version} ' cuda-drivers-570 nvidia-open-570 'nvidia-driver-pinning-*' "
        "2>/dev/null; echo",
        "cat /run/reboot-required",
        "python3 -c \"import urllib.request as u;print(u.urlopen('http://127.0.0.1:9500/metrics').read().decode())\""
        " | grep -c '^DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{'",
        "python3 -c \"import urllib.request as u;print(u.urlopen('http://127.0.0.1:9200/metrics').read().decode())\""
        " | grep -c '^node_textfile_scrape_error'",
        "stat -c '%a' /srv/textfile /srv/ckpt2",
        "systemd-run --wait --pipe --quiet --collect printenv TORCH_NCCL_TRACE_BUFFER_SIZE NCCL_DEBUG",
        "grep -c TORCH_NCCL /etc/environment || true",
        "grep -c '^NCCL_ASYNC_ERROR_HANDLING=1' /etc/environment",
        "ls /opt/gf2/bin",
    ])).stdout.split("\n")
    # Proprietary flavour, exact version, no open; NVIDIA's pinning package for exactly that version.
    assert state[0].split() == ["cuda-drivers-570=570.172.08-1", "nvidia-driver-pinning-570.172.08=570.172.08-1"]
    assert "NVIDIA driver 570.172.08" in state[1]
    assert state[2] == "8"  # the extra counter, one sample per GPU
    assert state[3] == "1"
    assert state[4:6] == ["775", "700"]
    assert state[6:8] == ["50000", "WARN"]
    assert state[8] == "0"  # environment target not selected: /etc/environment untouched ...
    assert state[9] == "1"  # ... and the deprecated name only flagged
    assert state[10:12] == ["compare.fatbin", "gpu_burn"]


def newer_branches(rfleet, i):
    """NVIDIA's repository of node i gains branches 590 and 595 (595 without its pinning package): the node sees them
    after its next apt-get update."""
    return aptrepo.add_specs(rfleet.fleet(i).apt_dir, harness.DEFAULT_CACHE, NEWER_BRANCH_SPECS)


def versions(rfleet, i, *packages):
    """{package: "version status"} for the packages dpkg has a version of on node i (not virtual ones it merely knows,
    such as nvidia-driver-pinning, which the pinning packages provide and conflict with)."""
    out = sh(rfleet, i, "dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n' %s 2>/dev/null || true"
             % " ".join("'%s'" % p for p in packages)).stdout
    return {fields[0]: " ".join(fields[1:]) for fields in map(str.split, out.splitlines()) if len(fields) == 3}


def smi(rfleet, i):
    return sh(rfleet, i, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.split()


@pytest.mark.xdist_group("roles-node2")
def test_a_node_pinned_to_580_stays_there_when_the_repository_gains_newer_branches(run, rfleet):
    i, extra = 2, ("-e", '{"nvidia_driver_branch": "580"}')
    sh(rfleet, i, "apt-get update -q")
    first = run(DRIVER_CONVERGE, *extra, limit=node(rfleet, i))
    assert first.proc.returncode == 0, first.output[-4000:]
    installed = versions(rfleet, i, "nvidia-open*", "nvidia-driver-pinning-*", "nvidia-smi", "nvidia-persistenced")
    # The pre-590 names: the branch metapackage, NVIDIA's pinning package installed first, both held.
    assert installed == {"nvidia-open-580": "580.105.08-1 hi", "nvidia-driver-pinning-580": "580-1 hi",
                         "nvidia-smi": "580.105.08-1 ii", "nvidia-persistenced": "580.105.08-1 ii"}, installed
    assert smi(rfleet, i) == ["580.105.08", "580.105.08"]

    newer_branches(rfleet, i)
    sh(rfleet, i, "apt-get update -q")
    assert "595.71.05-1" in sh(rfleet, i, "apt-cache madison nvidia-smi").stdout  # apt does see the newer branches
    again = run(DRIVER_CONVERGE, *extra, limit=node(rfleet, i))
    assert again.proc.returncode == 0, again.output[-4000:]
    changed = [line for _, line in again.lines if line.startswith("changed:")]
    assert again.recap[node(rfleet, i)]["changed"] == 0, changed
    upgrade = sh(rfleet, i, "DEBIAN_FRONTEND=noninteractive apt-get -y -q upgrade").stdout
    assert versions(rfleet, i, "nvidia-open*", "nvidia-driver-pinning-*", "nvidia-smi", "nvidia-persistenced") \
        == installed, upgrade
    assert smi(rfleet, i) == ["580.105.08", "580.105.08"]

    # NVIDIA's pinning package alone (no dpkg hold, no apt preferences of the role) keeps the node on 580 ...
    alone = sh(rfleet, i, "apt-mark unhold nvidia-open-580 nvidia-driver-pinning-580 >/dev/null && "
                          "rm /etc/apt/preferences.d/gpufleet-nvidia-driver.pref && apt-get -s upgrade").stdout
    assert not re.search(r"^Inst nvidia-", alone, re.M), alone
    # ... and without any pin apt would take the newest branch: what the assertions above rule out can happen.
    unpinned = sh(rfleet, i, "mkdir -p /tmp/no-pins && apt-get -s -o Dir::Etc::PreferencesParts=/tmp/no-pins "
                             "-o Dir::Etc::Preferences=/tmp/no-pins/none upgrade").stdout
    assert re.search(r"^Inst nvidia-smi \[580\.105\.08-1\] \(595\.71\.05-1 ", unpinned, re.M), unpinned


@pytest.mark.xdist_group("roles-node3")
def test_branch_590_installs_under_the_new_names_and_595_without_a_pinning_package_is_refused(run, rfleet):
    i = 3
    newer_branches(rfleet, i)
    sh(rfleet, i, "apt-get update -q")
    refused = run(DRIVER_CONVERGE, "-e", '{"nvidia_driver_branch": "595"}', limit=node(rfleet, i))
    assert refused.proc.returncode != 0
    out = " ".join(refused.output.split())
    assert ("the repository file:/srv/gpufleet-apt/ has nvidia-open 595.x but not NVIDIA's pinning package "
            "nvidia-driver-pinning-595.") in out, out[-3000:]
    assert versions(rfleet, i, "nvidia-*", "cuda-drivers*") == {}

    extra = ("-e", '{"nvidia_driver_branch": "590"}')
    first = run(DRIVER_CONVERGE, *extra, limit=node(rfleet, i))
    assert first.proc.returncode == 0, first.output[-4000:]
    # From 590 on: unversioned names, the branch chosen by nvidia-driver-pinning-590 although 595 is newer.
    installed = versions(rfleet, i, "nvidia-*", "cuda-drivers*")
    assert installed == {"nvidia-open": "590.48.01-1 hi", "nvidia-driver-pinning-590": "590-1 hi",
                         "nvidia-smi": "590.48.01-1 ii", "nvidia-persistenced": "590.48.01-1 ii"}, installed
    assert smi(rfleet, i) == ["590.48.01", "590.48.01"]
    assert sh(rfleet, i, "systemctl is-active nvidia-persistenced").stdout.strip() == "active"
    again = run(DRIVER_CONVERGE, *extra, limit=node(rfleet, i))
    assert again.proc.returncode == 0 and again.recap[node(rfleet, i)]["changed"] == 0, again.output[-3000:]
    sh(rfleet, i, "DEBIAN_FRONTEND=noninteractive apt-get -y -q upgrade")
    assert versions(rfleet, i, "nvidia-*", "cuda-drivers*") == installed


def keep(dir):
    """For molecule create.yml: a 1-node fleet kept up until <dir>/stop exists (the harness downs it at exit)."""
    fleet = build_fleet(dir, 1, os.environ.get("GPUFLEET_MOLECULE_PREFIX", "gpfm"),
                        os.environ.get("GPUFLEET_MOLECULE_SUBNET", "10.213.10"))
    (Path(dir) / "ready").write_text(fleet.nodes[0].ip + "\n")
    while not (Path(dir) / "stop").exists():
        time.sleep(1)
    fleet.down()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "keep" and sys.argv[2] == "--dir":
        keep(sys.argv[3])
    else:
        sys.exit("usage: %s keep --dir DIR" % sys.argv[0])
