# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""What is checked on the controller before a run touches any node (kentino.gpufleet.run_guard), as pure functions.

- every gpufleet_* variable of every target host is a name the collection knows (a typo such as
  gpufleet_burn_duraton_s would otherwise be ignored and the node judged with the default), with "did you mean";
- role and playbook variables have their argument spec's types, choices, ranges and formats, thresholds their
  kinds;

One list says what the variables are: the gpufleet role's argument spec (names, types, choices, defaults, and the
ranges and formats its "Range:" and "Format:" lines give, hack/gen_thresholds.py); the names a run sets itself are
read from the role's tasks, the playbooks and the facts modules' documentation. Nothing here lists a variable of its
own.
- the reports directory is writable and no other run is writing to it (a lock holding the run's PID);
- the run gets an id no other run has (time plus random suffix).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import secrets
import tempfile
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible_collections.kentino.gpufleet.plugins.module_utils.nccl_check import BYTE_COUNT
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import THRESHOLDS, resolve
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.unit_values import clean_path

COLLECTION = Path(__file__).resolve().parents[2]
ROLE_SPEC = COLLECTION / "roles" / "gpufleet" / "meta" / "argument_specs.yml"
LOCK_NAME = ".gpufleet-run.lock"

# Names a run composes (gpufleet_result_<module>), the simulator's and the provisioning play's own.
RUNTIME_PREFIXES = ("gpufleet_result_", "gpufleet_sim_", "gpufleet_provision_")
RANGE = re.compile(r"^Range: (at least|more than) (-?[0-9.]+)(?:, at most (-?[0-9.]+))?\.$")
# "Format: <what>." lines: the patterns a string option's value must match whole, by what the line says.
FORMATS = {"a byte count with an optional K, M or G suffix (8, 128M, 1G)": BYTE_COUNT}
FORMAT = re.compile(r"^Format: (.+)\.$")


@lru_cache(maxsize=None)
def _spec():
    with open(ROLE_SPEC) as fh:
        return yaml.safe_load(fh)["argument_specs"]["main"]["options"]


def role_spec():
    """The gpufleet role's options: its knobs, the playbooks' variables and the thresholds (one list)."""
    return dict(_spec())


def _lines(option):
    desc = option.get("description") or []
    return [desc] if isinstance(desc, str) else list(desc)


def ranges(spec=None):
    """{name: (lowest, lowest allowed, highest or None)} from the options' "Range:" lines."""
    out = {}
    for name, option in (spec if spec is not None else _spec()).items():
        for line in _lines(option):
            match = RANGE.match(line) if line.startswith("Range:") else None
            if match:
                kind, low, high = match.groups()
                out[name] = (float(low), kind == "at least", float(high) if high else None)
    return out


def formats(spec=None):
    """{name: (what, pattern)} from the options' "Format:" lines; a line naming no known format is an error (a test
    reads every spec line through this)."""
    out = {}
    for name, option in (spec if spec is not None else _spec()).items():
        for line in _lines(option):
            if line.startswith("Format:"):
                match = FORMAT.match(line)
                if not match or match.group(1) not in FORMATS:
                    raise ValueError("%s: %r names no format run_guard knows (%s)" % (name, line, ", ".join(FORMATS)))
                out[name] = (match.group(1), FORMATS[match.group(1)])
    return out


@lru_cache(maxsize=None)
def runtime_names():
    """The gpufleet_* names a run sets itself (registered results, set_fact keys, the facts modules' facts), read
    from the role's tasks, the playbooks and the modules' RETURN documentation: never an inventory typo."""
    names = set()

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("register"), str):
                names.add(node["register"])
            for key in ("ansible.builtin.set_fact", "set_fact", "ansible.builtin.set_stats"):
                if isinstance(node.get(key), dict):
                    names.update(k for k in node[key] if isinstance(k, str))
                    if isinstance(node[key].get("data"), dict):
                        names.update(node[key]["data"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in sorted(COLLECTION.glob("roles/gpufleet/tasks/**/*.yml")) + sorted(COLLECTION.glob("playbooks/*.yml")):
        with open(path) as fh:
            walk(yaml.safe_load(fh))
    for path in sorted((COLLECTION / "plugins" / "modules").glob("*.py")):
        text = path.read_text()
        if 'RETURN = r"""' in text:
            doc = yaml.safe_load(text.split('RETURN = r"""', 1)[1].split('"""', 1)[0]) or {}
            names.update((doc.get("ansible_facts") or {}).get("contains") or {})
    names.update(("gpufleet_run_started", "gpufleet_interrupted"))  # the fleet report's and run_record's inputs
    return frozenset(n for n in names if n.startswith("gpufleet_") and "{{" not in n)


def collection_role_options():
    """Every option of every role of the collection: an inventory that provisions its nodes sets them next to the
    checks' variables (gpufleet_node_exporter_* start with gpufleet_ too)."""
    names = set()
    for spec in sorted((COLLECTION / "roles").glob("*/meta/argument_specs.yml")):
        with open(spec) as fh:
            for entry in (yaml.safe_load(fh) or {}).get("argument_specs", {}).values():
                names.update((entry or {}).get("options") or {})
    return names


def known_names():
    return set(_spec()) | collection_role_options() | set(THRESHOLDS) | set(runtime_names())


def unknown_variables(host, names, known=None):
    """Errors for gpufleet_* names the collection does not know, each with the closest known names."""
    known = known if known is not None else known_names()
    errors = []
    for name in sorted(names):
        if not name.startswith("gpufleet_") or name in known or name.startswith(RUNTIME_PREFIXES):
            continue
        close = difflib.get_close_matches(name, sorted(known), n=2, cutoff=0.75)
        hint = " (did you mean %s?)" % " or ".join(close) if close else ""
        errors.append("host %s: unknown variable %s%s: it would be ignored and the default used; fix its name in the "
                      "inventory or -e (a variable of your own: list it in gpufleet_site_vars)" % (host, name, hint))
    return errors


# The role's options that name a file or directory on the node (besides those of type path): each is given to a
# module that creates, reads or runs it, so it is checked whole, normalised, before any node is touched.
NODE_PATHS = ("gpufleet_checkpoint_path", "gpufleet_dryrun_entrypoint", "gpufleet_dryrun_torchrun",
              "gpufleet_train_home", "gpufleet_burn_executable", "gpufleet_dcgm_executable", "gpufleet_nccl_executable")
# Paths on the controller: relative to the directory the run starts from is fine (the default reports is), written
# the way it is meant all the same.
CONTROLLER_PATHS = ("gpufleet_report_dir", "gpufleet_history_dir", "gpufleet_abort_record")


def type_errors(host, values, spec=None):
    """Errors for role and playbook variables of the wrong type, choice, range or format (the argument spec and its
    "Range:" and "Format:" lines), paths that are not clean (unit_values.clean_path), and thresholds of the wrong
    kind (thresholds.resolve, the report's own check of them)."""
    spec = spec if spec is not None else _spec()
    options = {k: v for k, v in spec.items() if k not in THRESHOLDS}
    given = {k: v for k, v in values.items() if k in options and v is not None}
    errors = []
    result = ArgumentSpecValidator(options).validate(given)
    for message in result.error_messages:
        errors.append("host %s: %s (roles/gpufleet/meta/argument_specs.yml)" % (host, message))
    for name, value in sorted(given.items()):
        is_path = options[name].get("type") == "path" or name in NODE_PATHS
        if not (is_path and isinstance(value, str) and value):
            continue
        if name in CONTROLLER_PATHS and not clean_path(value if value.startswith("/") else "/" + value):
            errors.append("host %s: %s=%r is not a normalised path (no . or .. component, no doubled or trailing "
                          "slash) of letters, digits and . _ - + @ , = (docs/security.md)" % (host, name, value))
        elif name not in CONTROLLER_PATHS and not clean_path(value):
            errors.append("host %s: %s=%r is not an absolute, normalised path (no . or .. component, no doubled or "
                          "trailing slash) of letters, digits and . _ - + @ , = (docs/security.md)" % (host, name, value))
    bad = set()
    for message in result.error_messages:
        bad.update(name for name in given if name in message)
    checked = dict((name, result.validated_parameters.get(name)) for name in given if name not in bad)
    resolved, _sources, threshold_errors = resolve(values, host)
    # A threshold of a valid kind can still be out of its spec's range (gpufleet_fabric_accuse_partners: at least 2).
    checked.update((name, resolved.get(name)) for name in THRESHOLDS if values.get(name) is not None)
    for name, (low, low_ok, high) in ranges(spec).items():
        value = checked.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and (
                value < low or (value == low and not low_ok) or (high is not None and value > high)):
            errors.append("host %s: %s is %s, must be %s%s (roles/gpufleet/meta/argument_specs.yml)" % (
                host, name, values[name], "at least %g" % low if low_ok else "more than %g" % low,
                ", at most %g" % high if high is not None else ""))
    for name, (what, pattern) in formats(spec).items():
        value = checked.get(name)
        if isinstance(value, str) and not pattern.match(value):
            errors.append("host %s: %s=%r is not %s (roles/gpufleet/meta/argument_specs.yml)" % (host, name, value,
                                                                                                 what))
    return errors + threshold_errors


RUN_RECORD = "kentino.gpufleet.run_record"
CONFIG_FIX = ("in the ansible.cfg of the directory you run from (the collection's inventories/example/ansible.cfg, "
              "docs/operating.md)")


def controller_config_warnings(callbacks_enabled, forks, nodes):
    """What the controller's Ansible configuration lacks for this run, each with the setting that fixes it."""
    warnings = []
    if RUN_RECORD not in (callbacks_enabled or []):
        warnings.append("the callback %s is not enabled: a run interrupted by Ctrl-C or a controller error leaves no "
                        "report; set callbacks_enabled = %s %s" % (RUN_RECORD, RUN_RECORD, CONFIG_FIX))
    if isinstance(forks, int) and 0 < forks < nodes:
        warnings.append("forks is %d for %d nodes: Ansible runs a task on %d nodes at a time, so every long check "
                        "(the burn) takes %d rounds; set forks = %d or more %s" % (
                            forks, nodes, forks, -(-nodes // forks), nodes, CONFIG_FIX))
    return warnings


def hosts_text(hosts, shown=5):
    """'a, b, c, d, e and 3 more': the same problem on many hosts, said once, the hosts in order (the same line
    whatever order the inventory or the workers gave them in)."""
    hosts = sorted(hosts)
    return ", ".join(hosts[:shown]) + (" and %d more" % (len(hosts) - shown) if len(hosts) > shown else "")


SSH_PERSIST = re.compile(r"(?:^|\s)-o\s*ControlPersist[=\s]\s*(\S+)", re.I)
SSH_CONNECTIONS = ("ssh", "ansible.builtin.ssh")


def control_persist_s(ssh_args):
    """Seconds ssh_args keep an idle SSH connection open (ControlPersist 60, 60s, 1m30s; no: 0), None when they do
    not say or keep it open for good (yes, 0): only a finite time can be shorter than a wait."""
    found = SSH_PERSIST.search(ssh_args or "")
    if not found:
        return None
    value = found.group(1).lower()
    if value == "no":
        return 0
    parts = re.findall(r"(\d+)([smhdw]?)", value)
    if not parts or "".join(n + u for n, u in parts) != value:
        return None
    seconds = sum(int(n) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[u] for n, u in parts)
    return seconds or None


def ssh_persist_warnings(nodes):
    """nodes: [(host, ssh_args, poll_s)] of the nodes reached over SSH. A connection that closes before the next poll
    of a waiting check makes every poll open a new one: a warning for each (persistence, poll) naming its nodes."""
    by_setting = {}
    for host, ssh_args, poll_s in nodes:
        persist = control_persist_s(ssh_args)
        if persist is not None and persist < poll_s:
            by_setting.setdefault((persist, poll_s), []).append(host)
    return ["SSH connections close %d s after their last use (ControlPersist in ssh_args), before the next poll of a "
            "waiting check %d s later on %s: every poll opens a new connection (a key exchange on the controller and "
            "the node); set ssh_args = -C -o ControlMaster=auto -o ControlPersist=%ds under [ssh_connection] %s" % (
                persist, poll_s, hosts_text(hosts), max(300, poll_s + 60), CONFIG_FIX)
            for (persist, poll_s), hosts in sorted(by_setting.items())]


def new_reports_note(report_dir):
    """A relative reports directory that no run has used yet: say where this run's reports and history start, since
    running from another directory would start another one without a word."""
    if os.path.isabs(report_dir) or os.path.lexists(os.path.join(report_dir, "latest")):
        return None
    return ("reports go to %s, a new reports directory: gpufleet_report_dir (%s) is relative to the directory you run "
            "from, and each reports directory keeps its own history. Run from this directory each time, or set "
            "gpufleet_report_dir to an absolute path." % (os.path.abspath(report_dir), report_dir))


def new_run_id(now=None):
    """Unique even for two runs started in the same second: the time plus 24 random bits."""
    now = now or datetime.now(timezone.utc)
    return "%s-%s" % (now.strftime("%Y%m%dT%H%M%SZ"), secrets.token_hex(3))


def check_report_dir(path):
    """None when `path` exists (or can be created) and is writable, else the reason."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return "cannot create the reports directory %s: %s" % (path, exc.strerror or exc)
    if not os.path.isdir(path):
        return "the reports directory %s is not a directory" % path
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".gpufleet-write-check-"):
            pass
    except OSError as exc:
        return "the reports directory %s is not writable: %s" % (path, exc.strerror or exc)
    return None


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return b"ansible" in fh.read()
    except OSError:
        return True


def take_lock(report_dir, run_id, pid, playbook):
    """(lock path, None) or (None, why another run holds it). A lock whose process is gone is stale: replaced."""
    path = os.path.join(report_dir, LOCK_NAME)
    try:
        with open(path) as fh:
            held = json.load(fh)
        if int(held.get("pid", 0)) != pid and _alive(int(held.get("pid", 0))):
            return None, ("another run is in progress: run %s (%s, pid %s, started %s) is writing to %s; wait for "
                          "it, stop it (gpufleet abort), or set gpufleet_report_dir" % (
                              held.get("run_id"), held.get("playbook"), held.get("pid"), held.get("started"),
                              report_dir))
    except (OSError, ValueError, TypeError):
        pass
    tmp = "%s.%d" % (path, pid)
    with open(tmp, "w") as fh:
        json.dump({"pid": pid, "run_id": run_id, "playbook": playbook,
                   "started": datetime.now(timezone.utc).replace(microsecond=0).isoformat()}, fh)
    os.replace(tmp, path)
    return path, None


def release_lock(report_dir, run_id):
    """Remove the lock if this run holds it."""
    path = os.path.join(report_dir, LOCK_NAME)
    try:
        with open(path) as fh:
            if json.load(fh).get("run_id") == run_id:
                os.unlink(path)
    except (OSError, ValueError):
        pass
