"""What every hack/gen_* script does with its text: write the generated file, or with --check say whether the file
in the tree is current (exit 1 and the command to run when it is not); where the collection and its docs are.

The alert rule generators ship in the collection artifact too (a site reruns them with its own options), so paths
work from a clone and from an installed collection (ansible_collections/kentino/gpufleet/hack/).
"""

import argparse
import json
import re
import sys
from pathlib import Path

COLLECTION = Path(__file__).resolve().parents[1]
# What a unit's Documentation= and a rule's runbook_url may hold: an http(s) URL of URL characters, without "%"
# (systemd's specifiers), quotes, spaces or control characters. The roles' preflights check the same.
DOCS_URL = re.compile(r"\Ahttps?://[][A-Za-z0-9._~:/?#@!$&()*+,;=-]+\Z")


def collections_dir(collection=COLLECTION):
    """The directory from which ansible_collections.kentino.gpufleet imports: a clone's collections/ (a link back to
    the clone), or the collections path an installed collection lives in."""
    clone = collection / "collections"
    return clone if clone.is_dir() else collection.parents[2]


def docs_base_url(collection=COLLECTION):
    """The project's docs pages in its repository: galaxy.yml's repository (a clone) or MANIFEST.json's (an installed
    collection), plus /blob/main/docs. The roles' *_docs_base_url defaults are this value."""
    repository = None
    galaxy = collection / "galaxy.yml"
    manifest = collection / "MANIFEST.json"
    if galaxy.is_file():
        for line in galaxy.read_text().splitlines():
            if line.startswith("repository:"):
                repository = line.split(":", 1)[1].strip()
    elif manifest.is_file():
        repository = json.loads(manifest.read_text())["collection_info"].get("repository")
    if not repository:
        raise SystemExit("no repository in %s's galaxy.yml or MANIFEST.json: give --docs-base-url" % collection)
    return repository.rstrip("/") + "/blob/main/docs"


def docs_url(text):
    """argparse type of --docs-base-url."""
    if not DOCS_URL.match(text):
        raise argparse.ArgumentTypeError("%r is not an http:// or https:// URL of URL characters only (no spaces, "
                                         "quotes, control characters or %%)" % text)
    return text.rstrip("/")


def write_or_check(output, text, check, script):
    output = Path(output)
    if check:
        if not output.exists() or output.read_text() != text:
            sys.stderr.write("%s is out of date: run hack/%s\n" % (output, script))
            return 1
        return 0
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    return 0
