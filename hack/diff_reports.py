#!/usr/bin/env python3
"""Diff two report.json files finding for finding, ignoring times, run ids and wording.

Usage: hack/diff_reports.py OLD/report.json NEW/report.json
Compares per node: the verdict, and the multiset of (check, code, severity, GPU index) of the findings. Prints what
only one side has; exit status 1 when they differ. Check names that were renamed are mapped (CHECK_RENAMES).
"""

import json
import sys
from collections import Counter

# Checks named after their modules since report schema 1.1.
CHECK_RENAMES = {"samples": "gpu_sample", "env": "training_env_facts", "xid": "xid_facts"}


def key(finding):
    check = CHECK_RENAMES.get(finding.get("check"), finding.get("check"))
    return (check, finding["code"], finding["severity"], finding.get("gpu"))


def load(path):
    with open(path) as fh:
        doc = json.load(fh)
    return {n["host"]: n for n in doc["nodes"]}


def main(old_path, new_path):
    old, new = load(old_path), load(new_path)
    differ = False
    for host in sorted(set(old) | set(new)):
        a, b = old.get(host), new.get(host)
        if a is None or b is None:
            print("%s: only in %s" % (host, "new" if a is None else "old"))
            differ = True
            continue
        if a["verdict"] != b["verdict"]:
            print("%s: verdict %s -> %s" % (host, a["verdict"], b["verdict"]))
            differ = True
        fa, fb = Counter(key(f) for f in a["findings"]), Counter(key(f) for f in b["findings"])
        for item in sorted((fa - fb).elements(), key=str):
            print("%s: - %s" % (host, item))
            differ = True
        for item in sorted((fb - fa).elements(), key=str):
            print("%s: + %s" % (host, item))
            differ = True
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
