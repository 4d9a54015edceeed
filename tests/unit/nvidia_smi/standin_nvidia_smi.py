"""Stand-in `nvidia-smi` for the module tests: answers from a fixture scenario directory like the real tool.

Copied into tmp_path as `nvidia-smi` (see conftest.py). Environment:
  NVSMI_STANDIN_DIR    scenario directory (query_gpu.csv with a header, help_query_gpu.txt, q.txt, compute_apps.csv,
                       optional samples/query_gpu_NNN.csv served in turn, optional meta.json {"rc": {call: code}})
  NVSMI_STANDIN_LOG    file that gets one JSON line (argv) per call, so tests can count calls
  NVSMI_STANDIN_STATE  counter file for samples/
Like the real tool it rejects the WHOLE query when one field is not in its --help-query-gpu list, printing
`Field "X" is not a valid field to query.` and exiting non-zero. Lines of a fixture that are not rows (error messages
of a lost GPU) pass through verbatim, in place.
"""

import json
import os
import re
import sys

HERE = os.environ["NVSMI_STANDIN_DIR"]


def read(name):
    with open(os.path.join(HERE, name)) as fh:
        return fh.read()


def meta_rc(call):
    path = os.path.join(HERE, "meta.json")
    if not os.path.exists(path):
        return 0
    with open(path) as fh:
        return json.load(fh).get("rc", {}).get(call, 0)


def strip_unit(cell):
    return re.sub(r"\s*\[[^\]]*\]\s*$", "", cell).strip()


def is_header(line):
    return all(re.match(r"^[a-z_][a-z0-9_.]*(\s*\[[^\]]*\])?$", c.strip()) for c in line.split(","))


def select(text, requested, with_header, free_text):
    """Columns `requested` of a fixture csv (its header line names the columns); every other line passes through."""
    lines = text.splitlines()
    at = next((i for i, line in enumerate(lines) if is_header(line)), None)
    if at is None:  # the tool printed only an error (driver not loaded)
        return text
    header_cells = lines[at].split(", ")
    names = [strip_unit(c) for c in header_cells]
    for f in requested:
        if f not in names:
            sys.stderr.write("stand-in: fixture %s lacks column %s\n" % (HERE, f))
            sys.exit(99)
    out = lines[:at]
    if with_header:
        out.append(", ".join(header_cells[names.index(f)] for f in requested))
    for line in lines[at + 1:]:
        cells = line.split(", ")
        if len(cells) > len(names) and free_text in names:  # a name with ", " inside
            i = names.index(free_text)
            extra = len(cells) - len(names)
            cells = cells[:i] + [", ".join(cells[i:i + extra + 1])] + cells[i + extra + 1:]
        if len(cells) != len(names):
            out.append(line)
            continue
        out.append(", ".join(cells[names.index(f)] for f in requested))
    return "\n".join(out) + "\n"


def main(argv):
    log = os.environ.get("NVSMI_STANDIN_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(json.dumps(argv) + "\n")
    if "--help-query-gpu" in argv:
        sys.stdout.write(read("help_query_gpu.txt"))
        return 0
    fmt = next((a.split("=", 1)[1] for a in argv if a.startswith("--format=")), "csv")
    for arg in argv:
        if arg.startswith("--query-gpu="):
            requested = arg.split("=", 1)[1].split(",")
            valid = set(re.findall(r'"([A-Za-z0-9_.]+)"', read("help_query_gpu.txt")))
            for field in requested:
                if field not in valid:
                    sys.stdout.write('Field "%s" is not a valid field to query.\n\n' % field)
                    return 2
            call = "query_gpu"
            name = "query_gpu.csv"
            samples = os.path.join(HERE, "samples")
            if os.path.isdir(samples):
                state = os.environ["NVSMI_STANDIN_STATE"]
                n = int(open(state).read()) if os.path.exists(state) else 0
                files = sorted(os.listdir(samples))
                name = os.path.join("samples", files[min(n, len(files) - 1)])
                call = "query_gpu_%03d" % min(n, len(files) - 1)
                with open(state, "w") as fh:
                    fh.write(str(n + 1))
            sys.stdout.write(select(read(name), requested, "noheader" not in fmt, "name"))
            return meta_rc(call)
        if arg.startswith("--query-compute-apps="):
            requested = arg.split("=", 1)[1].split(",")
            sys.stdout.write(select(read("compute_apps.csv"), requested, "noheader" not in fmt, "process_name"))
            return meta_rc("compute_apps")
    if "-q" in argv or "--query" in argv:
        sys.stdout.write(read("q.txt"))
        return meta_rc("q")
    sys.stderr.write("stand-in: unsupported arguments %r\n" % (argv,))
    return 98


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
