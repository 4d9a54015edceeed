"""Every stand-in package spec under tests/fleet/packages/ builds (dpkg-deb, from its equivs-style control file) into
the package it claims to be; what the builder puts in a package, and what it refuses."""

import os
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


def dpkg_deb(*args):
    return subprocess.run(["dpkg-deb", *map(str, args)], capture_output=True, text=True, check=True).stdout


def test_a_spec_builds_files_links_scripts_and_conffiles_as_written(tmp_path):
    spec = tmp_path / "gpufleet-example"
    spec.mkdir()
    (spec / "tool").write_text("#!/bin/sh\necho hi\n")
    (spec / "tool").chmod(0o775)
    (spec / "tool.service").write_text("[Service]\nExecStart=/usr/bin/tool\n[Install]\nWantedBy=multi-user.target\n")
    (spec / "tool.conf").write_text("x=1\n")
    (spec / "postinst").write_text("#!/bin/sh\nexit 0\n")
    (spec / "control").write_text(
        "# a comment line\nSection: misc\nPriority: optional\nStandards-Version: 4.6.2\nPackage: gpufleet-example\n"
        "Version: 1:2.3-1\nMaintainer: kentino.gpufleet <gpufleet@localhost>\nArchitecture: all\nDepends: python3\n"
        "Files: tool /usr/bin/\n tool.service /lib/systemd/system/\n tool.conf /etc/gpufleet-example/\n"
        "Links: /usr/bin/tool /usr/sbin/tool-link\nPostinst: postinst\n"
        "Description: an example\n Two lines.\n")
    (deb,) = aptrepo.build_spec(spec, tmp_path / "cache")
    assert deb.name == "gpufleet-example_2.3-1_all.deb"  # the file name carries no epoch, as apt's own do
    fields = dict(line.split(": ", 1) for line in dpkg_deb("-f", deb).splitlines() if ": " in line)
    assert fields["Version"] == "1:2.3-1" and fields["Depends"] == "python3" and fields["Multi-Arch"] == "foreign"
    assert "Standards-Version" not in fields and int(fields["Installed-Size"]) > 0
    listing = {line.split()[5]: (line.split()[0], line.split()[-1]) for line in dpkg_deb("-c", deb).splitlines()}
    assert listing["./usr/bin/tool"][0] == "-rwxr-xr-x" and listing["./lib/systemd/system/tool.service"][0] == "-rw-r--r--"
    assert listing["./usr/sbin/tool-link"] == ("lrwxrwxrwx", "/usr/bin/tool")
    assert "./usr/share/doc/gpufleet-example/copyright" in listing
    control = tmp_path / "control"
    dpkg_deb("-e", deb, control)
    # Only the spec's own script: a shipped unit is not enabled or started by installing the package.
    assert sorted(os.listdir(control)) == ["conffiles", "control", "postinst"]
    assert (control / "conffiles").read_text() == "/etc/gpufleet-example/tool.conf\n"
    assert (control / "postinst").read_text() == "#!/bin/sh\nexit 0\n" and os.access(control / "postinst", os.X_OK)


@pytest.mark.parametrize("control, error", [
    ("Package: gpufleet-bad\nVersion: 1\nDepend: python3\nDescription: typo\n x\n", "line 3: unknown field 'Depend'"),
    ("Package: gpufleet-bad\nVersion: 1\n\nDescription: blank\n x\n", "line 3: a blank line"),
    ("Package: gpufleet-bad\nDescription: no version\n x\n", "no Version field"),
    ("Package: gpufleet-bad\nVersion: 1\nFiles: f usr/bin/\nDescription: relative\n x\n", "must be absolute"),
    ("Package: gpufleet-bad\nVersion: 1\nFiles: f /usr/../../x/\nDescription: escapes\n x\n", "without `..`"),
])
def test_a_malformed_spec_is_refused_with_the_spec_and_the_reason(tmp_path, control, error):
    spec = tmp_path / "gpufleet-bad"
    spec.mkdir()
    (spec / "f").write_text("x")
    (spec / "control").write_text(control)
    with pytest.raises(aptrepo.AptRepoError) as exc:
        aptrepo.build_spec(spec, tmp_path / "cache")
    assert str(spec) in str(exc.value) and error in str(exc.value)
