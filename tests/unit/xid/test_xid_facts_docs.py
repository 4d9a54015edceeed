"""xid_facts docs: every description/notes item must be a string (an unquoted 'a: b' silently becomes a mapping,
which `ansible-doc --json` accepts but the text renderer rejects)."""

import subprocess
import sys
from pathlib import Path

import yaml
from ansible_collections.kentino.gpufleet.plugins.modules import xid_facts

REPO = Path(__file__).resolve().parents[3]


def _texts(node, path, out):
    if isinstance(node, dict):
        for key, value in node.items():
            named_entry = isinstance(value, dict) and "description" in value  # a return value called "notes"
            if key in ("description", "notes", "short_description") and not named_entry:
                for item in value if isinstance(value, list) else [value]:
                    if not isinstance(item, str):
                        out.append("%s.%s: %r" % (path, key, item))
            if key not in ("sample", "default"):
                _texts(value, "%s.%s" % (path, key), out)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _texts(value, "%s[%d]" % (path, i), out)


def test_doc_texts_are_strings():
    problems = []
    _texts(yaml.safe_load(xid_facts.DOCUMENTATION), "DOCUMENTATION", problems)
    _texts(yaml.safe_load(xid_facts.RETURN), "RETURN", problems)
    assert not problems, problems


def test_ansible_doc_text_renders():
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-doc")), "kentino.gpufleet.xid_facts"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "severity_overrides" in proc.stdout, proc.stderr
