"""Every string option of every role, generated from its meta/argument_specs.yml, fed hostile values: a newline that
would add a directive, control characters, quotes, "%" (systemd specifiers), ".." and spaces. Each must be refused
before anything changes (the argument spec or the role's preflight asserts, evaluated here with Ansible's own
templating) or come out inert in every template the role renders (rendered here as Ansible renders them, then
parsed: the same lines and directives as with a sane value, no new word, quote, specifier or variable, no control
character). A path option must refuse "..": a path is normalised before it is trusted.

Fast: templates and conditions are evaluated in-process (no playbook run); a new option is covered without touching
this file, and one without a sane sample value below fails until it gets one.
"""

import re
import shlex
from functools import cache
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible_collections.kentino.gpufleet.plugins.filter.systemd import FilterModule
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import run_guard
from ansible_collections.kentino.gpufleet.plugins.test.unit_values import TestModule
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[3]
# The collection's own test and filter plugins under their FQCN, as Ansible's plugin loader would provide them (the
# loader needs the collection finder, which these tests do not install over the plain package import).
COLLECTION_TESTS = {"kentino.gpufleet." + k: v for k, v in TestModule().tests().items()}
COLLECTION_FILTERS = {"kentino.gpufleet." + k: v for k, v in FilterModule().filters().items()}

PAYLOADS = {
    "newline": "\nExecStartPre=/bin/sh -c id",
    "control": "\x01\x1b[2J",
    "quote": "\" '",
    "percent": "%h%n",
    "dotdot": "/../../etc",
    "space": " two words",
}
# Sane values for options without a usable default (required, templated, or empty by default); the payload is
# appended to them. A value here must pass the role's checks: the baseline test below proves it.
SAMPLES = {
    "elastic_training_entrypoint": "/srv/train/train.py",
    "elastic_training_torchrun": "/opt/train/venv/bin/torchrun",
    "elastic_training_working_directory": "/srv/train",
    "elastic_training_checkpoint_dir": "/mnt/nvme/checkpoints/train",
    "elastic_training_rdzv_endpoint": "node1:29400",
    "elastic_training_max_nodes": 1,
    "elastic_training_local_addr": "10.0.0.1",
    "elastic_training_drain_reason": "riser reseat",
    "os_gate_role": "kentino.gpufleet.training_env",
    "nvidia_driver_cuda_repo_url": "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64",
    "nvidia_driver_cuda_repo_keyring_url":
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/3bf863cc.pub",
    "nvidia_driver_kernel_headers_package": "linux-headers-generic",
    "gpu_monitoring_log_file": "/var/log/kern.log",
    "audit_timer_inventory": "/etc/gpufleet/inventory.yml",
    "audit_timer_limit": "gpu_nodes",
    "audit_timer_collections_path": "/opt/gpufleet/collections",
    "audit_timer_ansible_config": "/etc/gpufleet/ansible.cfg",
    "training_env_vars": {"TORCH_NCCL_TRACE_BUFFER_SIZE": "20000"},
    "validation_tools_gpu_burn_url": "https://example.invalid/gpu-burn-1.0.tar.gz",
    "validation_tools_gpu_burn_checksum": "sha256:" + "0" * 64,
    "validation_tools_nccl_tests_url": "https://example.invalid/nccl-tests-2.0.tar.gz",
    "validation_tools_nccl_tests_checksum": "sha256:" + "1" * 64,
}
# Options that are a path (a directory or file on the node), whatever their spec type.
PATHLIKE = re.compile(r"_(dir|directory|path|paths|home|file|prefix|python|torchrun|entrypoint|"
                      r"ansible_playbook|ansible_config|inventory|keyring_path|nvcc_path)$")
FACTS = {"distribution": "Ubuntu", "distribution_version": "22.04", "distribution_major_version": "22",
         "distribution_release": "jammy", "os_family": "Debian", "architecture": "x86_64", "machine": "x86_64",
         "kernel": "5.15.0-100-generic", "mounts": [], "getent_passwd": {}, "getent_group": {},
         "service_mgr": "systemd", "env": {}, "hostname": "node1", "nodename": "node1"}
CONTEXT = {"inventory_hostname": "node1", "inventory_hostname_short": "node1", "ansible_managed": "Ansible managed",
           "groups": {"all": ["node1"], "gpufleet_nodes": ["node1"]}, "ansible_play_hosts_all": ["node1"],
           "ansible_play_hosts": ["node1"], "hostvars": {"node1": {"ansible_host": "10.0.0.1"}},
           "ansible_facts": FACTS, "ansible_check_mode": False, "ansible_limit": "node1",
           "ansible_config_file": "/etc/ansible/ansible.cfg", "playbook_dir": str(REPO / "playbooks")}
ROLES = sorted(p.parents[1].name for p in REPO.glob("roles/*/meta/argument_specs.yml"))
# Keys systemd splits into words (quotes group words; "%" and, on Exec lines, "$" are expanded).
WORD_KEYS = re.compile(r"^(Exec\w+|Environment|ReadWritePaths|ReadOnlyPaths|InaccessiblePaths|SupplementaryGroups|"
                       r"CapabilityBoundingSet|AmbientCapabilities|RestrictAddressFamilies|SuccessExitStatus|"
                       r"RestartPreventExitStatus|Wants|After|Requires|WantedBy|Before|BindPaths|"
                       r"BindReadOnlyPaths|DefaultEnvironment)$")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _trusted(value):
    """Role files are trusted templates in Ansible (inventory values too; the payloads hold no template)."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    return value


def _load(path):
    return yaml.safe_load(path.read_text()) if path.exists() else None


@cache
def role_files(role):
    base = REPO / "roles" / role
    specs = _load(base / "meta" / "argument_specs.yml")["argument_specs"]
    options = {}
    for entry in specs.values():
        for name, spec in (entry.get("options") or {}).items():
            options.setdefault(name, spec)
    asserts = []

    def walk(tasks):
        for task in tasks or []:
            if not isinstance(task, dict):
                continue
            for key in ("block", "rescue", "always"):
                walk(task.get(key))
            body = task.get("ansible.builtin.assert") or task.get("assert")
            if isinstance(body, dict):
                that = body.get("that")
                when = task.get("when")
                asserts.append(([that] if isinstance(that, str) else list(that),
                                [when] if isinstance(when, (str, bool)) else list(when or []),
                                task.get("vars") or {}))

    for name in ("preflight.yml", "preflight_os.yml"):
        walk(_load(base / "tasks" / name))
    templates = sorted((base / "templates").glob("*.j2")) if (base / "templates").is_dir() else []
    return options, (_load(base / "defaults" / "main.yml") or {}), (_load(base / "vars" / "main.yml") or {}), \
        asserts, templates


def sample(name, spec):
    if name in SAMPLES:
        return SAMPLES[name]
    default = spec.get("default")
    if default not in (None, "", [], {}):
        return default
    kind = spec.get("type", "str")
    if kind == "list":
        return ["/srv/x"] if PATHLIKE.search(name) or spec.get("elements") == "path" else ["x"]
    if kind == "dict":
        return {}
    return "/srv/x" if kind == "path" or PATHLIKE.search(name) else "x"


def role_vars(role, overrides):
    options, defaults, variables, _asserts, _templates = role_files(role)
    values = dict(CONTEXT, role_path=str(REPO / "roles" / role))
    values.update(_trusted(defaults))
    values.update({n: SAMPLES[n] for n in options if n in SAMPLES})
    values.update(_trusted(variables))
    values.update(overrides)
    return values


def templar(values):
    t = Templar(loader=DataLoader(), variables=values)
    environment = t._engine.environment  # the public attribute is deprecated; this is a test's view into it
    environment.tests.update(COLLECTION_TESTS)
    environment.filters.update(COLLECTION_FILTERS)
    return t


def _condition(t, text):
    if isinstance(text, bool):
        return text
    return t.evaluate_conditional(trust_as_template(str(text)))


def preflight(role, values, stop=None):
    """(condition, True, False or 'error') per assert condition ('error': Ansible fails the task, a refusal too).
    stop(condition, result) -> True ends the walk there."""
    out = []
    for that, when, task_vars in role_files(role)[3]:
        t = templar(dict(values, **_trusted(task_vars)))
        try:
            active = all(_condition(t, w) for w in when)
        except Exception:  # noqa: BLE001 - a `when` on facts this test does not fake: decided per condition below
            active = True
        for condition in that:
            try:
                result = _condition(t, condition) if active else True
            except Exception:  # noqa: BLE001 - any templating error fails the assert task in Ansible too
                result = "error"
            out.append((condition, result))
            if stop is not None and stop(condition, result):
                return out
    return out


@cache
def sane_preflight(role):
    return dict(preflight(role, role_vars(role, {})))


def render(role, values):
    t = templar(values)
    out = {}
    for path in role_files(role)[4]:
        try:
            out[path.name] = t.template(trust_as_template(path.read_text()))
        except Exception as exc:  # noqa: BLE001 - a template that fails is a task that fails: nothing written
            out[path.name] = exc
    return out


def refused(role, name, value):
    """Why the role refuses this value before any change, or None."""
    options = role_files(role)[0]
    spec = {k: v for k, v in options[name].items() if k in ("type", "choices", "elements", "required")}
    errors = ArgumentSpecValidator({name: spec}).validate({name: value}).error_messages
    if errors:
        return "argument spec: %s" % errors[0]
    if role == "gpufleet":  # the check playbooks' first play validates the role's variables (run_guard)
        errors = run_guard.type_errors("node1", {name: value})
        if errors:
            return "run_guard: %s" % errors[0]
    base = sane_preflight(role)

    def refusing(condition, result):
        return result is False or (result == "error" and base.get(condition) is True)

    condition, result = (preflight(role, role_vars(role, {name: value}), stop=refusing) or [(None, True)])[-1]
    return "preflight: %s" % condition if refusing(condition, result) else None


def _key(line):
    s = line.strip()
    if not s or s.startswith(("#", ";")):
        return ("comment",)
    if s.startswith("[") and s.endswith("]"):
        return ("section", s)
    for sep in ("=", ":"):
        if sep in s:
            return ("key", s.split(sep, 1)[0].strip())
    return ("text",)


def _words(value):
    try:
        return len(shlex.split(value.replace("\\\n", " ")))
    except ValueError:
        return "unbalanced quotes"


def _specifiers(value):
    return len(re.findall(r"%[^%]", value.replace("%%", "")))


def _variables(value):
    return len(re.findall(r"\$[^$]", value.replace("$$", "")))


def not_inert(name, baseline, hostile):
    """Why a rendered file is not inert (differs from the sane rendering in more than the value's text), or None."""
    if isinstance(hostile, Exception):
        return None  # the template task fails: nothing is written
    if isinstance(baseline, Exception):
        return "the sane value does not render: %s" % baseline
    if CONTROL.search(hostile):
        return "a control character is written: %r" % CONTROL.search(hostile).group(0)
    a, b = baseline.splitlines(), hostile.splitlines()
    if [_key(x) for x in a] != [_key(x) for x in b]:
        return "the lines differ: %r" % [x for x in b if x not in a][:3]
    unit = name.endswith((".service.j2", ".timer.j2", ".conf.j2")) and "[" in baseline
    for old, new in zip(a, b, strict=True):
        if old == new or _key(new)[0] != "key":
            continue
        key = _key(new)[1]
        old_value, new_value = old.split("=", 1)[-1], new.split("=", 1)[-1]
        if unit and _specifiers(new_value) != _specifiers(old_value):
            return "a new systemd specifier in %r" % new
        if unit and key.startswith("Exec") and _variables(new_value) != _variables(old_value):
            return "a new variable in %r" % new
        if (unit and WORD_KEYS.match(key)) or name.endswith(".sh.j2"):
            if _words(new_value) != _words(old_value):
                return "the words of %r differ (%s, was %s)" % (new, _words(new_value), _words(old_value))
        if name.endswith(".sh.j2") and (new.count("$") != old.count("$") or new.count("`") != old.count("`")):
            return "a shell expansion in %r" % new
        if len(re.findall(r'(?<!\\)"', new)) != len(re.findall(r'(?<!\\)"', old)):
            return "the quotes of %r differ" % new
    return None


def hostile_values(name, spec, payload):
    """(label, hostile value, the same shape with a sane value) to try for one option and one payload: the payload
    appended to a sane value, as an element of a list, or in a key and in a value of a mapping."""
    base = sample(name, spec)
    text = PAYLOADS[payload]
    kind = spec.get("type", "str")
    if kind == "list":
        items = list(base) if isinstance(base, list) and base else ["x"]
        return [("element", items[:-1] + [str(items[-1]) + text], items)]
    if kind == "dict":
        if name.endswith("service_overrides"):
            sane = {"Service": {"Nice": "5"}}
            return [("section", {"Service" + text: {"Nice": "5"}}, sane),
                    ("key", {"Service": {"Nice" + text: "5"}}, sane), ("value", {"Service": {"Nice": "5" + text}}, sane)]
        sane = dict(base if isinstance(base, dict) else {}, MY_KEY="1")
        return [("key", dict(base if isinstance(base, dict) else {}, **{"MY_KEY" + text: "1"}), sane),
                ("value", dict(sane, MY_KEY="1" + text), sane)]
    if kind in ("int", "float", "bool"):
        return []
    return [("value", str(base) + text, base)]


def cases():
    for role in ROLES:
        for name, spec in sorted(role_files(role)[0].items()):
            if spec.get("type", "str") not in ("str", "path", "raw", "list", "dict"):
                continue
            if spec.get("type") == "list" and spec.get("elements", "str") not in ("str", "path"):
                continue
            for payload in PAYLOADS:
                yield pytest.param(role, name, payload, id="%s-%s" % (name, payload))


def check(role, name, payload):
    spec = role_files(role)[0][name]
    problems = []
    for label, value, sane in hostile_values(name, spec, payload):
        why = refused(role, name, value)
        if why:
            continue
        if payload == "dotdot" and PATHLIKE.search(name):
            problems.append("%s %r accepted: a path with '..' must be refused" % (label, value))
            continue
        baseline = render(role, role_vars(role, {name: sane}))
        for template, text in render(role, role_vars(role, {name: value})).items():
            bad = not_inert(template, baseline[template], text)
            if bad:
                problems.append("%s %r accepted and %s renders it: %s" % (label, value, template, bad))
    return problems


@pytest.mark.parametrize("role", ROLES)
def test_sane_values_pass_the_preflight_and_render(role):
    failed = [c for c, result in preflight(role, role_vars(role, {})) if result is False]
    assert not failed, "the sample values are refused: %s" % failed
    for template, text in render(role, role_vars(role, {})).items():
        assert not isinstance(text, Exception), "%s: %s" % (template, text)


@pytest.mark.parametrize("role,name,payload", list(cases()))
def test_hostile_value_is_refused_or_inert(role, name, payload):
    problems = check(role, name, payload)
    assert not problems, "%s.%s: %s" % (role, name, "; ".join(problems))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([(r, n) for r in ["elastic_training", "audit_timer", "gpu_monitoring", "training_env"]
                        for n, s in sorted(role_files(r)[0].items()) if s.get("type", "str") in ("str", "path")]),
       st.text(alphabet=st.sampled_from(list("\n\r\t\x00\x1b\"'\\%$` ;=/.aZ09-_[]#")), min_size=1, max_size=8))
def test_any_suffix_on_a_unit_role_option_is_refused_or_inert(option, suffix):
    role, name = option
    spec = role_files(role)[0][name]
    value = str(sample(name, spec)) + suffix
    if refused(role, name, value):
        return
    assert not (PATHLIKE.search(name) and ".." in value.split("/")), value
    baseline = render(role, role_vars(role, {}))
    for template, text in render(role, role_vars(role, {name: value})).items():
        assert not_inert(template, baseline[template], text) is None, (name, value, template)


SYSTEM = ["/", "/etc", "/usr", "/bin", "/boot", "/dev", "/proc", "/sys", "/var", "/var/lib", "/home", "/root", "/tmp",
          "/etc/ssh", "/usr/lib", "/var/log"]


@pytest.mark.parametrize("role,name", [("elastic_training", "elastic_training_checkpoint_dir"),
                                       ("elastic_training", "elastic_training_state_directory"),
                                       ("elastic_training", "elastic_training_metrics_directory"),
                                       ("training_env", "training_env_checkpoint_dir"),
                                       ("training_env", "training_env_dump_dir"),
                                       ("audit_timer", "audit_timer_home"),
                                       ("gpu_monitoring", "gpu_monitoring_state_directory"),
                                       ("gpufleet_node_exporter", "gpufleet_node_exporter_textfile_directory")])
@pytest.mark.parametrize("path", SYSTEM + ["/var/lib/../../etc", "/mnt/nvme/../../etc/"])
def test_a_system_directory_is_never_created_or_given_to_a_service_user(role, name, path):
    # /var/lib/../../etc is /etc: the role would chown it to the training user (seen in --check --diff before).
    assert refused(role, name, path), "%s=%s accepted" % (name, path)


@pytest.mark.parametrize("path", ["/mnt/nvme/checkpoints/llm", "/srv/ckpt-elastic", "/var/lib/gpufleet-elastic/x"])
def test_a_data_directory_is_accepted(path):
    assert refused("elastic_training", "elastic_training_checkpoint_dir", path) is None


def _directives(text):
    out = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";")):
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_the_training_job_runs_as_a_dedicated_user_in_a_hardened_unit():
    # Before: User=root and none of the hardening the watcher's and the audit's units have.
    unit = _directives(render("elastic_training", role_vars("elastic_training", {}))["gpufleet-elastic.service.j2"])
    assert unit["User"] == ["gpufleet-train"] and unit["Group"] == ["gpufleet-train"]
    for key, value in (("ProtectSystem", "strict"), ("ProtectHome", "read-only"), ("PrivateTmp", "yes"),
                       ("NoNewPrivileges", "yes"), ("RestrictSUIDSGID", "yes"), ("ProtectKernelModules", "yes")):
        assert unit[key] == [value], key
    # torchrun writes checkpoints, the launcher its state, the ranks their metrics; the dumps stay where the
    # post-mortem reads them despite the private /var/tmp.
    assert unit["ReadWritePaths"] == ["-/mnt/nvme/checkpoints/train -/var/lib/gpufleet-elastic/train "
                                      "-/var/lib/gpufleet-elastic/metrics"]
    assert unit["BindPaths"] == ["-/var/tmp/gpufleet-nccl-dumps"]
    assert "PrivateDevices" not in unit  # the GPUs are devices


def test_the_role_creates_its_user_only_when_missing():
    tasks = yaml.safe_load((REPO / "roles" / "elastic_training" / "tasks" / "install.yml").read_text())
    create = next(t for t in tasks if "ansible.builtin.user" in t)
    assert create["ansible.builtin.user"]["system"] is True and create["ansible.builtin.user"]["shell"] == \
        "/usr/sbin/nologin"
    assert "ansible_facts['getent_passwd'][elastic_training_user] is none" in create["when"]
    assert "elastic_training_create_user | bool" in create["when"]


@pytest.mark.parametrize("role,name,value", [
    # apt's local repository form (the test fleet's stand-in packages): file: and one slash
    ("nvidia_driver", "nvidia_driver_cuda_repo_url", "file:/srv/gpufleet-apt/"),
    ("nvidia_driver", "nvidia_driver_cuda_repo_keyring_url", "file:///srv/gpufleet-apt/3bf863cc.pub"),
    ("gpu_monitoring", "gpu_monitoring_nvidia_smi", ""),  # documented: empty disables it
])
def test_documented_values_pass_the_preflight(role, name, value):
    failed = [c for c, result in preflight(role, role_vars(role, {name: value})) if result is False]
    assert not failed, "%s=%r is refused: %s" % (name, value, failed)
