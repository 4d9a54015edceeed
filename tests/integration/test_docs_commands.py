"""Every command block of README.md and docs/*.md runs here as written, or is marked as needing real nodes.

A command block is a ```sh block, or a code block (fenced without a data language, or indented) whose lines start with
a command (a program on PATH, a stand-in of sim/bin, a script of the clone, a shell builtin). Each is either

- marked by an HTML comment on the line before it (the nearest non-blank line): `<!-- docs-test: needs real nodes -->`
  (GPU nodes of your own: `-i hosts.yml`, `my-inventory`) or `<!-- docs-test: needs root ... -->` (the real test
  fleet), or
- listed in EXECUTED below with how it runs. The blocks of one page run in order in one shell per block, the working
  directory carried from block to block as a user's `cd` would, in a scratch directory: a copy of the clone's tracked
  files, HOME a fresh directory (so `~/.ansible/collections` is this test's), no ANSIBLE_* or GPUFLEET_* variables.
  "run": as typed. "syntax": with --syntax-check, where a full run of that command is already covered by another test
  (named). "dry-run": `make -n`, the recipe without running it (named where the full run is covered).

test_every_command_block_is_run_or_marked fails on a new command block that is neither, and on an EXECUTED entry no
page has any more.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PAGES = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
MARKER = re.compile(r"\A<!-- docs-test: needs (real nodes|root\b[^>]*) -->\Z")
SHELL_LANGS = {"sh", "bash", "shell", "console"}
DATA_LANGS = {"yaml", "yml", "ini", "json", "python", "toml", "text", "promql"}
BUILTINS = {"cd", "export", "mkdir", "cp", "sudo", "source", "set", "echo", "ls", "cat", "rm", "mv"}
# Programs a page may name that are not installed where the tests run.
PROGRAMS = {"ansible-playbook", "ansible-galaxy", "ansible-doc", "ansible", "gpufleet", "python3", "python", "make",
            "promtool", "systemd-nspawn", "curl", "pip", "torchrun", "nvidia-smi", "dcgmi"}
INSTALLED = "~/.ansible/collections/ansible_collections/kentino/gpufleet"
SIM = INSTALLED + "/inventories/sim"
BURN_IN_COVERED = ("the 9-node burn-in of inventories/sim runs in tests/integration/test_sim_burn_in.py (burn_in_run); "
                   "the installed inventories/sim in place runs for real in the preflight above")

# The documented commands this test runs: {command as the page writes it (comments and continuations joined):
# (how, why)}.
EXECUTED = {
    "make demo": ("dry-run", "its burn-in: tests/integration/test_sim_burn_in.py (the same playbook and inventory)"),
    "make test": ("dry-run", "make test runs this suite"),
    "make demo-loop": ("dry-run", "tests/integration/test_demo_loop.py runs its script"),
    "python3 -m pip install 'ansible-core>=2.17' 'jsonschema>=4.18'": ("run", "already satisfied: nothing downloaded"),
    "ansible-galaxy collection build --force --output-path dist . && ANSIBLE_COLLECTIONS_PATH=~/.ansible/collections "
    "ansible-galaxy collection install dist/kentino-gpufleet-*.tar.gz": ("run", ""),
    "ansible-galaxy collection build --force --output-path dist .": ("run", ""),
    "ANSIBLE_COLLECTIONS_PATH=~/.ansible/collections ansible-galaxy collection install "
    "dist/kentino-gpufleet-0.1.0.tar.gz": ("run", "the version of galaxy.yml"),
    "ansible-doc -l kentino.gpufleet": ("run", "no warning, as docs/operating.md says"),
    "ansible-doc -t role -l kentino.gpufleet": ("run", "no warning, as docs/operating.md says"),
    "mkdir ~/my-fleet && cd ~/my-fleet": ("run", ""),
    "mkdir -p ~/my-fleet && cd ~/my-fleet": ("run", ""),
    "cp -r %s/inventories/example/. ." % INSTALLED: ("run", ""),
    "ansible-playbook kentino.gpufleet.preflight -i %s -l sim-node01,localhost" % SIM: ("run", ""),
    "ansible-playbook kentino.gpufleet.burn_in -i %s -e gpufleet_fail_on=never" % SIM: ("syntax", BURN_IN_COVERED),
    "gpufleet plan --gpus 64 --checkpoint-gb 140 --write-mb-s 2500 --interval-min 30 --price 2.1": ("run", ""),
    "gpufleet plan": ("run", "in the preflight's directory, as docs/training.md says"),
    "python3 %s/hack/gen_alert_rules.py --scrape-interval 15s --node-job node --docs-base-url "
    "https://wiki.example.com/gpufleet --output my-rules.yml" % INSTALLED: ("run", ""),
}
# Where a page's first block starts (default: the copy of the clone).
START = {"docs/training.md": "~/my-fleet"}
# Pages in the order a user reads them: README, then operating.md (the user's directory and its preflight), then
# the pages that build on it.
ORDER = ["README.md", "docs/operating.md", "docs/monitoring.md", "docs/training.md"]


@dataclass
class Block:
    page: str
    line: int
    lang: str
    text: list = field(default_factory=list)
    marker: str = None

    def commands(self):
        """The commands of the block: continuations joined, comments dropped."""
        out, pending = [], ""
        for raw in self.text:
            line = raw.strip()
            if pending:
                line = pending + " " + line
                pending = ""
            if line.endswith("\\"):
                pending = line[:-1].rstrip()
                continue
            line = re.sub(r"\s+#\s.*\Z", "", line).strip()
            if line and not line.startswith("#"):
                out.append(" ".join(line.split()))
        return out


def code_blocks(page):
    """Every fenced or indented code block of a Markdown page, with the marker comment above it if any."""
    rel = str(page.relative_to(REPO))
    lines = page.read_text().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        fence = re.match(r"^```(\S*)", lines[i])
        if fence:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            blocks.append(Block(rel, i + 1, fence.group(1) or "-", lines[i + 1:end]))
            i = end + 1
            continue
        if lines[i].startswith("    ") and lines[i].strip() and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or (not lines[j].strip() and j + 1 < len(lines)
                                                                         and lines[j + 1].startswith("    "))):
                j += 1
            blocks.append(Block(rel, i + 1, "indented", lines[i:j]))
            i = j
            continue
        i += 1
    for block in blocks:
        above = [x.strip() for x in lines[:block.line - 1] if x.strip()]
        if above and MARKER.match(above[-1]):
            block.marker = above[-1]
    return blocks


def _is_command(line):
    words = line.split()
    while words and (words[0] in ("sudo", "$") or re.match(r"\A[A-Z_][A-Z0-9_]*=", words[0])):
        words = words[1:]  # a prompt, sudo, or the environment given to the command
    if not words:
        return False
    word = words[0]
    if not re.match(r"\A[\w.~/-]+\Z", word):  # a YAML key (name:), a unit or journal line (name[...], <job>)
        return False
    return (word in BUILTINS or word in PROGRAMS or (REPO / "sim" / "bin" / word).exists() or (REPO / word).is_file()
            or shutil.which(word) is not None)


def command_blocks():
    for page in PAGES:
        for block in code_blocks(page):
            if block.lang in SHELL_LANGS or (block.lang not in DATA_LANGS and
                                             any(_is_command(c) for c in block.commands())):
                yield block


def test_every_command_block_is_run_or_marked():
    unrun, used = [], set()
    for block in command_blocks():
        if block.marker:
            continue
        for command in block.commands():
            if command in EXECUTED:
                used.add(command)
            else:
                unrun.append("%s:%d: %s" % (block.page, block.line, command))
    assert not unrun, ("documented commands neither run by tests/integration/test_docs_commands.py (EXECUTED) nor "
                       "marked <!-- docs-test: needs real nodes --> on the line before their block:\n  "
                       + "\n  ".join(unrun))
    stale = sorted(set(EXECUTED) - used)
    assert not stale, "EXECUTED lists commands no page has (any more): %s" % stale


def test_the_check_finds_command_blocks_and_knows_output_from_commands():
    blocks = {(b.page, b.line) for b in command_blocks()}
    by_page = {}
    for page, _line in blocks:
        by_page[page] = by_page.get(page, 0) + 1
    assert by_page.get("README.md", 0) >= 8 and by_page.get("docs/operating.md", 0) >= 7, by_page
    readme = code_blocks(REPO / "README.md")
    output = next(b for b in readme if b.text and b.text[0].strip().startswith("Fleet report"))
    assert (output.page, output.line) not in blocks, "the demo's output table is not a command block"
    assert all(b.marker for b in command_blocks() if b.page == "docs/test-fleet.md")


def test_the_controller_configuration_is_documented_once():
    # docs/operating.md shows the shipped inventories/example/ansible.cfg; no other page shows another one.
    shipped = (REPO / "inventories" / "example" / "ansible.cfg").read_text().strip()
    shown = [(b.page, "\n".join(b.text).strip()) for page in PAGES for b in code_blocks(page)
             if any(line.strip() == "[defaults]" for line in b.text)]
    assert shown == [("docs/operating.md", shipped)], shown


def _scratch_clone(dest):
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    for rel in filter(None, (f.decode() for f in files)):
        src = REPO / rel
        if src.exists() or src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel, follow_symlinks=False)


def _installed_files(root):
    """An installed collection's files, but Python's bytecode caches (written when the controller imports it)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if "__pycache__" not in p.parts)


@pytest.mark.slow
def test_documented_commands_run_as_written(tmp_path):
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout to copy the tracked files")
    clone, home = tmp_path / "clone", tmp_path / "home"
    clone.mkdir()
    home.mkdir()
    _scratch_clone(clone)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANSIBLE_", "GPUFLEET_")) and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # HOME is the scratch home, not the passwd entry's: Ansible's async writer expands ~ with $HOME, its readers
    # (async_status, job_wait) with the passwd entry, so the async directory is given as an absolute path.
    env.update(HOME=str(home), PATH=str(BIN) + os.pathsep + env.get("PATH", ""),
               ANSIBLE_ASYNC_DIR=str(home / ".ansible_async"))
    blocks = [b for b in command_blocks() if not b.marker]
    pages = sorted({b.page for b in blocks}, key=lambda p: ORDER.index(p) if p in ORDER else len(ORDER))
    outputs = {}
    for page in pages:
        cwd = START.get(page, str(clone))
        for block in (b for b in blocks if b.page == page):
            script = ["set -e", 'cd %s' % cwd]
            for command in block.commands():
                how, _why = EXECUTED[command]
                script.append({"run": command, "syntax": command + " --syntax-check",
                               "dry-run": command.replace("make ", "make -n ", 1)}[how])
            script.append("pwd > %s" % (tmp_path / "cwd"))
            proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=clone, env=env, capture_output=True,
                                  text=True, timeout=900)
            said = proc.stdout + proc.stderr
            assert proc.returncode == 0, "%s:%d failed (rc %s):\n%s" % (page, block.line, proc.returncode, said[-4000:])
            cwd = (tmp_path / "cwd").read_text().strip()
            for command in block.commands():
                outputs.setdefault(command, said)

    root = home / ".ansible" / "collections" / "ansible_collections" / "kentino" / "gpufleet"
    fleet = home / "my-fleet"
    # The user's directory: the shipped ansible.cfg and inventory; the preflight's report and the nodes' state there.
    assert (fleet / "ansible.cfg").read_text() == (REPO / "inventories" / "example" / "ansible.cfg").read_text()
    preflight = outputs[next(c for c in EXECUTED if c.startswith("ansible-playbook kentino.gpufleet.preflight"))]
    report = yaml.safe_load((fleet / "reports" / "latest" / "report.json").read_text())
    assert [(n["host"], n["verdict"]) for n in report["nodes"]] == [("sim-node01", "pass")], preflight[-3000:]
    assert (fleet / "reports" / "sim-state" / "sim-node01" / "node.json").is_file()
    assert "reports go to %s, a new reports directory" % (fleet / "reports") in preflight
    assert "[WARNING]" not in preflight and "\x1b[" not in preflight, preflight[-3000:]
    assert "| sim-node01 | PASS |" in preflight and "HTML report: reports/" in preflight
    started, finished = (datetime.fromisoformat(report[k]) for k in ("started", "finished"))
    assert started < finished  # the run's own start (run_guard) and the report's time, not one time twice
    shipped = {entry["name"] for entry in json.loads((root / "FILES.json").read_text())["files"] if entry["name"] != "."}
    assert set(_installed_files(root)) == shipped | {"MANIFEST.json", "FILES.json"}, (
        "the run wrote into the installed collection: %s" % sorted(set(_installed_files(root)) - shipped))
    for listing in ("ansible-doc -l kentino.gpufleet", "ansible-doc -t role -l kentino.gpufleet"):
        assert "WARNING" not in outputs[listing], outputs[listing]
    assert "kentino.gpufleet.gpu_facts" in outputs["ansible-doc -l kentino.gpufleet"]
    assert "runbook_url: https://wiki.example.com/gpufleet/monitoring.md#" in (clone / "my-rules.yml").read_text()
    assert "optimal interval (Young)" in outputs["gpufleet plan"] and "sim-node01" in outputs["gpufleet plan"]
    assert "playbooks/burn_in.yml" in outputs["make demo"]
