"""The test fleet's local apt repository: stand-in vendor packages, the simulator package, and real Debian packages.

A flat `file://` repository (`deb [trusted=yes] file:/srv/gpufleet-apt ./` on the nodes, bind-mounted read-only), so
roles install packages with real apt on nodes that have no network:

- stand-in vendor packages under their real names, built with equivs from `tests/fleet/packages/<name>/control`
  (format: packages/README.md);
- `gpufleet-sim`, the simulated GPU tools from the repo's `sim/` directory, built with dpkg-deb;
- real Debian packages (prometheus-node-exporter ...) downloaded on the host together with the dependencies the base
  lacks, resolved by apt inside a throw-away overlay of the base so versions match what the nodes have.

Built .debs are cached under the fleet cache (keyed by their inputs), so a warm build costs an index run only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPECS = Path(__file__).resolve().parent / "packages"
DEFAULT_MIRROR = os.environ.get("GPUFLEET_TESTFLEET_MIRROR", "http://deb.debian.org/debian")
SIM_PACKAGE = "gpufleet-sim"
SIM_PREFIX = "/usr/lib/gpufleet-sim"
# Never link a stand-in over a tool the node's own packages ship (dpkg would refuse the file conflict, and the real
# journalctl/dmesg must keep working on a systemd node): those stand-ins stay in SIM_PREFIX/bin.
NO_LINK_IF_PRESENT = ("/usr/bin", "/bin", "/usr/sbin", "/sbin")


class AptRepoError(RuntimeError):
    pass


def _run(argv, cwd=None, timeout=600, env=None):
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise AptRepoError("command failed (rc=%s) in %s: %s\n%s" % (proc.returncode, cwd or os.getcwd(),
                                                                   shlex.join(argv), (proc.stdout + proc.stderr)[-3000:]))
    return proc


def _tree_hash(paths, extra=""):
    """Content hash of files (names, modes, bytes), ignoring caches, to key built .debs."""
    h = hashlib.sha256(extra.encode())
    for root in paths:
        root = Path(root)
        if not root.exists():
            continue
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*")
                                                     if p.is_file() and "__pycache__" not in p.parts)
        for f in files:
            h.update(str(f.relative_to(root.parent)).encode())
            h.update(str(f.stat().st_mode & 0o111).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _cache_dir(cache, kind, key):
    d = Path(cache) / "debs" / ("%s-%s" % (kind, key))
    return d


def _cached(d):
    return sorted(d.glob("*.deb")) if (d / ".complete").exists() else None


def _once(final, build):
    """The cached .debs of `final`, else build(tmp) them into a new directory that replaces it. Under a lock per entry:
    test workers running at once (pytest-xdist) build an entry once and never read one another's half-written one."""
    hit = _cached(final)
    if hit is not None:
        return hit
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / (".lock-" + final.name), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        hit = _cached(final)
        if hit is not None:
            return hit
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
        try:
            build(tmp)
            return _finish(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _finish(tmp, final, keep=3):
    (tmp / ".complete").write_text("")
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(final)
    tmp.rename(final)
    # Every edit of sim/ or a spec makes a new entry: keep the few newest of this kind, so the cache stays small.
    kind = final.name.rsplit("-", 1)[0]
    older = sorted((d for d in final.parent.glob(kind + "-*") if d != final and d.name.rsplit("-", 1)[0] == kind),
                   key=lambda d: d.stat().st_mtime)
    for stale in older[:max(0, len(older) - (keep - 1))]:
        shutil.rmtree(stale, ignore_errors=True)
    return sorted(final.glob("*.deb"))


# ------------------------------------------------------------------------------------------------------ equivs specs

def spec_names(specs=SPECS):
    return sorted(p.name for p in Path(specs).iterdir() if (p / "control").is_file()) if Path(specs).is_dir() else []


def build_spec(spec_dir, cache):
    """Build one equivs spec directory into .deb(s); `Files:` paths in the control file are relative to spec_dir."""
    spec_dir = Path(spec_dir)
    if not shutil.which("equivs-build"):
        raise AptRepoError("equivs-build not found: apt-get install equivs")
    key = _tree_hash([spec_dir])

    def build(tmp):
        work = tmp / "src"
        shutil.copytree(spec_dir, work)
        proc = subprocess.run(["equivs-build", "control"], cwd=work, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise AptRepoError("equivs-build of stand-in package spec %s failed (rc=%s): check its control file "
                               "(format: tests/fleet/packages/README.md)\n%s"
                               % (spec_dir, proc.returncode, (proc.stdout + proc.stderr)[-3000:]))
        for deb in work.glob("*.deb"):
            shutil.move(str(deb), tmp / deb.name)
        shutil.rmtree(work)
        if not list(tmp.glob("*.deb")):
            raise AptRepoError("equivs-build of %s produced no .deb" % spec_dir)

    return _once(_cache_dir(cache, "spec-" + spec_dir.name, key), build)


# -------------------------------------------------------------------------------------------------- simulator package

def build_sim_deb(cache, src=None, base=None, version=None):
    """Package the simulator: `src` (default <repo>/sim) goes to /usr/lib/gpufleet-sim, executables of src/bin are
    linked into /usr/bin (by postinst) unless the base or another package already has that path. Works with whatever
    `sim/` holds."""
    src = Path(src or REPO / "sim")
    if not src.is_dir():
        raise AptRepoError("no simulator sources at %s (sim/ not written yet?)" % src)
    key = _tree_hash([src], extra=str(base or ""))

    def build(tmp):
        root = tmp / "root"
        dest = root / SIM_PREFIX.lstrip("/")
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))
        links, skipped = [], []
        for tool in sorted((dest / "bin").glob("*")) if (dest / "bin").is_dir() else []:
            if not (tool.is_file() and os.access(tool, os.X_OK)):
                continue
            if base and any((Path(base) / d.lstrip("/") / tool.name).exists() for d in NO_LINK_IF_PRESENT):
                skipped.append(tool.name)
                continue
            links.append(tool.name)
        deb_version = version or "0.1.0+%s" % key
        (root / "DEBIAN").mkdir()
        # The /usr/bin links are made by postinst, not shipped: a stand-in vendor package (nvidia-smi,
        # datacenter-gpu-manager-4-core ...) may own the same path, and dpkg refuses two packages owning one file.
        # An unowned link is simply replaced when such a package is installed later.
        names = " ".join(links)
        (root / "DEBIAN/postinst").write_text(
            "#!/bin/sh\nset -e\nif [ \"$1\" = configure ]; then\n  for t in %s; do\n"
            "    [ -e /usr/bin/$t ] || [ -L /usr/bin/$t ] || ln -s %s/bin/$t /usr/bin/$t\n  done\nfi\n"
            % (names, SIM_PREFIX))
        (root / "DEBIAN/prerm").write_text(
            "#!/bin/sh\nset -e\nfor t in %s; do\n"
            "  [ \"$(readlink /usr/bin/$t 2>/dev/null)\" = %s/bin/$t ] && rm -f /usr/bin/$t || true\ndone\n"
            % (names, SIM_PREFIX))
        for script in ("postinst", "prerm"):
            (root / "DEBIAN" / script).chmod(0o755)
        (root / "DEBIAN/control").write_text(
            "Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: kentino.gpufleet <gpufleet@localhost>\n"
            "Depends: python3\nSection: misc\nPriority: optional\n"
            "Description: kentino.gpufleet simulated GPU tools (test fleet only)\n"
            " Stand-ins for nvidia-smi, dcgmi, gpu_burn ... answering from a scenario file.\n"
            " Linked into /usr/bin unless a package already provides it: %s.\n Kept in %s/bin only: %s.\n"
            % (SIM_PACKAGE, deb_version, ", ".join(links) or "none", SIM_PREFIX, ", ".join(skipped) or "none"))
        (tmp / "manifest.json").write_text(json.dumps({"links": links, "not_linked": skipped, "version": deb_version}))
        deb = tmp / ("%s_%s_all.deb" % (SIM_PACKAGE, deb_version))
        _run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)])
        shutil.rmtree(root)

    return _once(_cache_dir(cache, SIM_PACKAGE, key), build)




def sim_manifest(debs):
    """The links/not_linked record written next to a built simulator .deb."""
    for deb in debs:
        m = Path(deb).parent / "manifest.json"
        if deb.name.startswith(SIM_PACKAGE + "_") and m.exists():
            return json.loads(m.read_text())
    return {}


# ------------------------------------------------------------------------------------------------ real Debian packages

def download_debian(names, base, cache, mirror=None, suite="bookworm", timeout=600):
    """Download real Debian packages plus the dependencies the base lacks, resolved by apt inside a volatile overlay of
    the base (host network, nothing written to the base). Needs root, systemd-nspawn and the mirror."""
    mirror = mirror or DEFAULT_MIRROR
    names = sorted(set(names))
    key = hashlib.sha256(json.dumps([names, str(base), mirror, suite]).encode()).hexdigest()[:16]

    def build(tmp):
        (tmp / "partial").mkdir()
        script = (
            "set -e; rm -f /etc/apt/sources.list.d/gpufleet.list; "
            "echo 'deb %s %s main' > /etc/apt/sources.list.d/upstream.list; "
            "apt-get -q -o APT::Sandbox::User=root update >/dev/null; "
            "apt-get -q -y -o APT::Sandbox::User=root -o Dir::Cache::archives=/gpufleet-debs "
            "--no-install-recommends --download-only install %s"
            % (mirror, suite, " ".join(shlex.quote(n) for n in names)))
        argv = ["systemd-nspawn", "--quiet", "--register=no", "--keep-unit", "--directory=%s" % base,
                "--volatile=overlay", "--private-users=no", "--resolv-conf=copy-host", "--timezone=off",
                "--link-journal=no", "--bind=%s:/gpufleet-debs" % tmp, "/bin/sh", "-c", script]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise AptRepoError("downloading Debian packages %s for the test fleet failed (rc=%s): is %s reachable, "
                               "are the names right?\n%s" % (", ".join(names), proc.returncode, mirror,
                                                             (proc.stdout + proc.stderr)[-3000:]))
        shutil.rmtree(tmp / "partial", ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (tmp / "lock").unlink()

    return _once(_cache_dir(cache, "debian", key), build)




# ----------------------------------------------------------------------------------------------------------- the repo

def index_repo(repo_dir):
    """(Re)write Packages and Release for a flat repository; the nodes see changes after `apt-get update`."""
    repo_dir = Path(repo_dir)
    repo_dir.mkdir(parents=True, exist_ok=True)
    if shutil.which("apt-ftparchive"):
        packages = _run(["apt-ftparchive", "packages", "."], cwd=repo_dir).stdout
    else:
        packages = _run(["dpkg-scanpackages", "--multiversion", ".", "/dev/null"], cwd=repo_dir).stdout
    (repo_dir / "Packages").write_text(packages)
    release = ("Origin: kentino.gpufleet test fleet\nLabel: gpufleet-testfleet\nSuite: testfleet\nCodename: testfleet\n")
    if shutil.which("apt-ftparchive"):
        release = _run(["apt-ftparchive", "-o", "APT::FTPArchive::Release::Origin=kentino.gpufleet-testfleet",
                        "release", "."], cwd=repo_dir).stdout
    (repo_dir / "Release").write_text(release)
    return repo_dir


def add_debs(repo_dir, debs):
    repo_dir = Path(repo_dir)
    repo_dir.mkdir(parents=True, exist_ok=True)
    for deb in debs:
        shutil.copy2(deb, repo_dir / Path(deb).name)


def _check_spec_names(names, specs):
    missing = sorted(set(names) - set(spec_names(specs)))
    if missing:
        raise AptRepoError("no package spec %s under %s" % (", ".join(missing), specs))


def add_specs(repo_dir, cache, names, specs=SPECS):
    """Build the named specs into an existing repository and re-index it: to the nodes this is an update of the
    vendor's repository, seen after their next `apt-get update`. Returns the added .deb file names."""
    _check_spec_names(names, specs)
    debs = [deb for name in sorted(names) for deb in build_spec(Path(specs) / name, cache)]
    add_debs(repo_dir, debs)
    index_repo(repo_dir)
    return sorted(Path(d).name for d in debs)


def build_repo(repo_dir, cache, base=None, specs=SPECS, sim=True, debian=(), mirror=None, only=None):
    """Fill repo_dir with the specs under `specs` (all, or the names in `only`), the simulator (when sim/ exists) and
    `debian` packages; index it. Returns {"packages": [deb file names], "sim": manifest or None}.
    """
    repo_dir = Path(repo_dir)
    repo_dir.mkdir(parents=True, exist_ok=True)
    debs = []
    _check_spec_names(only or (), specs)
    for name in spec_names(specs) if only is None else sorted(only):
        debs += build_spec(Path(specs) / name, cache)
    manifest = None
    if sim and (REPO / "sim").is_dir():
        sim_debs = build_sim_deb(cache, base=base)
        manifest = sim_manifest(sim_debs)
        debs += sim_debs
    if debian:
        if base is None:
            raise AptRepoError("real Debian packages need the base (their dependencies are resolved against it)")
        debs += download_debian(debian, base, cache, mirror=mirror)
    add_debs(repo_dir, debs)
    index_repo(repo_dir)
    return {"packages": sorted(Path(d).name for d in debs), "sim": manifest}
