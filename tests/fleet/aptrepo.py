"""The test fleet's local apt repository: stand-in vendor packages, the simulator package, and real Debian packages.

A flat `file://` repository (`deb [trusted=yes] file:/srv/gpufleet-apt ./` on the nodes, bind-mounted read-only), so
roles install packages with real apt on nodes that have no network:

- stand-in vendor packages under their real names, built with dpkg-deb from the equivs-style control files
  `tests/fleet/packages/<name>/control` (format: packages/README.md);
- `gpufleet-sim`, the simulated GPU tools from the repo's `sim/` directory, built with dpkg-deb;
- real Debian packages (prometheus-node-exporter ...) downloaded on the host together with the dependencies the base
  lacks, resolved by apt inside a throw-away overlay of the base so versions match what the nodes have.

Built .debs are cached under the fleet cache (keyed by their inputs), so a warm build costs an index run only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
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
# The real Debian packages the fleet tests serve their nodes (the roles install node_exporter from Debian).
DEBIAN_PACKAGES = ("prometheus-node-exporter",)


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


# ------------------------------------------------------------------------------------------------ stand-in specs

def spec_names(specs=SPECS):
    return sorted(p.name for p in Path(specs).iterdir() if (p / "control").is_file()) if Path(specs).is_dir() else []


# An equivs-style control file, built straight with dpkg-deb: equivs-build runs a whole debhelper sequence per
# package (about 5 CPU-s each, 27 specs: two minutes of a cold CI run) for what is a control file and a few copies.
# These fields go to DEBIAN/control as written; the next ones say what the package holds.
CONTROL_FIELDS = ("Package", "Version", "Architecture", "Maintainer", "Section", "Priority", "Essential", "Multi-Arch",
                  "Pre-Depends", "Depends", "Recommends", "Suggests", "Breaks", "Conflicts", "Provides", "Replaces",
                  "Homepage", "Description")
CONTENT_FIELDS = ("Files", "Links", "Preinst", "Postinst", "Prerm", "Postrm")
SOURCE_ONLY_FIELDS = ("Standards-Version",)  # a source package's field: not in a binary package's control
# equivs' defaults, Multi-Arch included (foreign: an arch-all stand-in satisfies any architecture's dependency).
DEFAULTS = {"Architecture": "all", "Maintainer": "kentino.gpufleet <gpufleet@localhost>", "Section": "misc",
            "Priority": "optional", "Multi-Arch": "foreign"}


def parse_control(text):
    """One paragraph of `Field: value` lines, continuation lines starting with a space, `#` comment lines.
    Returns {field: value} (continuation lines joined with newlines); an unknown or repeated field is an error."""
    fields, name = {}, None
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            continue
        if not line.strip():
            raise AptRepoError("line %d: a blank line; a spec is one paragraph" % n)
        if line[0] in " \t":
            if name is None:
                raise AptRepoError("line %d: a continuation line before any field" % n)
            fields[name] += "\n" + line
            continue
        name, sep, value = line.partition(":")
        if not sep or name not in CONTROL_FIELDS + CONTENT_FIELDS + SOURCE_ONLY_FIELDS:
            raise AptRepoError("line %d: unknown field %r (known: %s)"
                               % (n, name, ", ".join(CONTROL_FIELDS + CONTENT_FIELDS)))
        if name in fields:
            raise AptRepoError("line %d: field %s given twice" % (n, name))
        fields[name] = value.strip()
    for required in ("Package", "Version", "Description"):
        if not fields.get(required):
            raise AptRepoError("no %s field" % required)
    return fields


def _spec_tree(spec_dir, fields, root):
    """Lay out the package under root: Files copied (executable bits kept, modes as dh_fixperms leaves them), Links
    made, maintainer scripts and conffiles (whatever lands in /etc) in DEBIAN/."""
    for line in fields.get("Files", "").splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2:
            raise AptRepoError("Files line %r: expected `<file in the spec> <absolute destination>`" % line.strip())
        src, dest = spec_dir / parts[0], parts[1]
        if not src.is_file():
            raise AptRepoError("Files line %r: no file %s" % (line.strip(), src))
        if not dest.startswith("/") or ".." in dest.split("/"):
            raise AptRepoError("Files line %r: the destination must be absolute, without `..`" % line.strip())
        target = root / dest.lstrip("/")
        if dest.endswith("/"):
            target = target / src.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)  # follows a spec's link to another spec's file
        target.chmod(0o755 if os.access(src, os.X_OK) else 0o644)
    for line in fields.get("Links", "").splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or not parts[1].startswith("/") or ".." in parts[1].split("/"):
            raise AptRepoError("Links line %r: expected `<target> <absolute link path>`" % line.strip())
        link = root / parts[1].lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(parts[0])
    doc = root / "usr/share/doc" / fields["Package"]
    doc.mkdir(parents=True, exist_ok=True)
    (doc / "copyright").write_text("A kentino.gpufleet test-fleet stand-in, built from tests/fleet/packages/%s.\n"
                                   % spec_dir.name)
    # As dpkg-gencontrol counts it: KiB per file, rounded up, and one per link and directory.
    installed_kib = sum(-(-p.lstat().st_size // 1024) if p.is_file() and not p.is_symlink() else 1
                        for p in root.rglob("*"))
    debian = root / "DEBIAN"
    debian.mkdir()
    for field in ("Preinst", "Postinst", "Prerm", "Postrm"):
        if field in fields:
            script = spec_dir / fields[field]
            if not script.is_file():
                raise AptRepoError("%s: no file %s" % (field, script))
            shutil.copyfile(script, debian / field.lower())
            (debian / field.lower()).chmod(0o755)
    conffiles = sorted("/" + str(p.relative_to(root)) for p in (root / "etc").rglob("*")
                       if p.is_file() and not p.is_symlink()) if (root / "etc").is_dir() else []
    if conffiles:
        (debian / "conffiles").write_text("".join(c + "\n" for c in conffiles))
    control = dict(DEFAULTS, **{k: v for k, v in fields.items() if k in CONTROL_FIELDS})
    control["Installed-Size"] = str(installed_kib)
    (debian / "control").write_text("".join("%s: %s\n" % (k, control[k])
                                            for k in CONTROL_FIELDS[:4] + ("Installed-Size",) + CONTROL_FIELDS[4:]
                                            if k in control))


def build_spec(spec_dir, cache):
    """Build one stand-in spec directory (format: packages/README.md) into its .deb with dpkg-deb; `Files:` paths in
    the control file are relative to spec_dir."""
    spec_dir = Path(spec_dir)
    # Keyed by the builder's code too: a cached package built another way (equivs, an older layout) is never served.
    key = _tree_hash([spec_dir], extra=inspect.getsource(parse_control) + inspect.getsource(_spec_tree))

    def build(tmp):
        where = "stand-in package spec %s/control (format: tests/fleet/packages/README.md)" % spec_dir
        try:
            fields = parse_control((spec_dir / "control").read_text())
            root = tmp / "root"
            _spec_tree(spec_dir, fields, root)
        except (OSError, AptRepoError) as exc:
            raise AptRepoError("%s: %s" % (where, exc)) from None
        arch = dict(DEFAULTS, **fields)["Architecture"]
        # The file name apt and dpkg-name use: the epoch (1:4.2.3-1) is not part of it.
        deb = tmp / ("%s_%s_%s.deb" % (fields["Package"], fields["Version"].split(":", 1)[-1], arch))
        _run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)])
        shutil.rmtree(root)

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


def build_cache(cache, base):
    """Every package the fleet tests serve, built (or downloaded) into the cache: each a no-op when cached. What
    `make test` prepares while its virtualenvs install (hack/testfleet cache), so that no test waits for it."""
    debs = [deb for name in spec_names() for deb in build_spec(SPECS / name, cache)]
    return debs + build_sim_deb(cache, base=base) + download_debian(DEBIAN_PACKAGES, base, cache)


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
