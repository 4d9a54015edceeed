"""Every stand-in package spec under tests/fleet/packages/ builds with equivs into the package it claims to be."""

import subprocess
import tempfile

import aptrepo
import harness
import pytest

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(300)]


@pytest.mark.parametrize("name", aptrepo.spec_names())
def test_every_package_spec_builds(name):
    debs = aptrepo.build_spec(aptrepo.SPECS / name, harness.DEFAULT_CACHE)
    assert len(debs) == 1, debs
    fields = subprocess.run(["dpkg-deb", "-f", str(debs[0]), "Package", "Version", "Architecture"],
                            capture_output=True, text=True, check=True).stdout
    info = dict(line.split(": ", 1) for line in fields.splitlines())
    # <package>/, or <package>@<variant>/ for another version of the same package (nvidia-smi@575/, nvidia-open@590/):
    # a directory named nvidia-open-590/ would claim a package nvidia-open-590 that NVIDIA does not ship.
    assert name == info["Package"] or name.startswith(info["Package"] + "@"), \
        "spec directory %s builds package %s: name the directory after the package (or <package>@<variant>)" \
        % (name, info["Package"])
    assert info["Version"] and info["Architecture"] in ("all", "amd64")
    listing = subprocess.run(["dpkg-deb", "-c", str(debs[0])], capture_output=True, text=True, check=True).stdout
    assert "./usr/share/doc/%s/" % info["Package"] in listing


def test_a_broken_spec_fails_with_the_spec_named(tmp_path):
    spec = tmp_path / "gpufleet-broken"
    spec.mkdir()
    (spec / "control").write_text("Package: gpufleet-broken\nVersion: 1\nFiles: missing-file /usr/bin/\n"
                                  "Description: broken on purpose\n x\n")
    with tempfile.TemporaryDirectory() as cache, pytest.raises(aptrepo.AptRepoError, match="gpufleet-broken"):
        aptrepo.build_spec(spec, cache)
