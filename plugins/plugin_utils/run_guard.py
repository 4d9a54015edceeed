# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""What is checked on the controller before a run touches any node (kentino.gpufleet.run_guard), as pure functions.

- every gpufleet_* variable of every target host is a name the collection knows (a typo such as
  gpufleet_burn_duraton_s would otherwise be ignored and the node judged with the default), with "did you mean";
- role variables have their argument spec's types and choices, thresholds their kinds;
- the reports directory is writable and no other run is writing to it (a lock holding the run's PID);
- the run gets an id no other run has (time plus random suffix).
"""

from __future__ import annotations

import difflib
import json
import os
import secrets
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import THRESHOLDS, resolve

COLLECTION = Path(__file__).resolve().parents[2]
ROLE_SPEC = COLLECTION / "roles" / "gpufleet" / "meta" / "argument_specs.yml"
LOCK_NAME = ".gpufleet-run.lock"

# Variables the playbooks and the collection set or read besides the role's options and the thresholds.
PLAYBOOK_VARS = {
    "gpufleet_hosts": "the host pattern the playbooks target (default gpufleet_nodes)",
    "gpufleet_fail_on": "the report's gate: fail, warn or never",
    "gpufleet_report_dir": "where reports are written (default reports)",
    "gpufleet_environment": "environment the plays apply on the nodes (the simulated fleet's tools)",
    "gpufleet_ssh_extra_args": "SSH arguments the playbooks use (keepalive so a dead node is noticed)",
    "gpufleet_train_home": "home directory whose login profile the environment check reads (default: the user's)",
    "gpufleet_history_enabled": "judge trends, drift and baselines from the history and record the run (default true)",
    "gpufleet_history_dir": "directory of the history file (default <gpufleet_report_dir>/history)",
    "gpufleet_history_days": "runs older than this many days leave the history (default 400)",
    "gpufleet_baseline_reset": "record this burn-in's figures as the nodes' new baselines (after a repair)",
    "gpufleet_site_vars": "a site's own variable names that start with gpufleet_ (accepted by this check)",
    "gpufleet_show_summary": "print the report's summary table at the end of the run (default true; the gpufleet "
                             "command prints its own)",
    "gpufleet_abort_run_id": "abort.yml: stop only this run's work (default: every recorded run's)",
    "gpufleet_abort_record": "abort.yml: a file on the controller where what each node stopped is written (JSON)",
}
# Set by the run itself (facts, registered results): never an inventory typo.
RUNTIME_VARS = ("gpufleet_stage", "gpufleet_completed", "gpufleet_refused_reason", "gpufleet_run",
                "gpufleet_run_id", "gpufleet_run_started", "gpufleet_xid_before", "gpufleet_stage_failures",
                "gpufleet_interrupted", "gpufleet_report", "gpufleet_gpus", "gpufleet_gpu_count", "gpufleet_xid",
                "gpufleet_driver_version", "gpufleet_gpu_problems", "gpufleet_pci_gpus", "gpufleet_training_env",
                "gpufleet_nvlink", "gpufleet_nvlink_before", "gpufleet_interrupt_cleanup")
RUNTIME_PREFIXES = ("gpufleet_result_", "gpufleet_sim_", "gpufleet_provision_")


def role_spec():
    with open(ROLE_SPEC) as fh:
        return yaml.safe_load(fh)["argument_specs"]["main"]["options"]


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
    return (set(role_spec()) | collection_role_options() | set(THRESHOLDS) | set(PLAYBOOK_VARS)
            | set(RUNTIME_VARS))


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


def type_errors(host, values, spec=None):
    """Errors for role variables of the wrong type or choice, and thresholds of the wrong kind."""
    spec = spec if spec is not None else role_spec()
    given = {k: v for k, v in values.items() if k in spec}
    errors = []
    result = ArgumentSpecValidator(spec).validate(given)
    for message in result.error_messages:
        errors.append("host %s: %s (roles/gpufleet/meta/argument_specs.yml)" % (host, message))
    _thresholds, _sources, threshold_errors = resolve(values, host)
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
