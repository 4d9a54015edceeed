"""roles/*/README.md are generated from meta/argument_specs.yml and must be current (hack/gen_role_readmes.py)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "gen_role_readmes.py"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_role_readmes", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_role_readme_is_current():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_readme_shows_the_intro_and_every_option():
    gen = _gen()
    text = gen.render("gpufleet_node_exporter")
    assert text.startswith(gen.MARKER)
    assert "carry the `gpufleet_` prefix" in text  # the hand-written intro, markup converted
    assert "| `gpufleet_node_exporter_textfile_directory` | path | `\"/var/lib/prometheus/node-exporter\"` |" in text
    assert "C(" not in text and "O(" not in text


def test_check_fails_on_a_stale_readme(tmp_path, monkeypatch):
    gen = _gen()
    role = tmp_path / "roles" / "demo"
    (role / "meta").mkdir(parents=True)
    (role / "meta" / "argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    short_description: Demo\n    description: [Intro.]\n"
        "    options:\n      demo_x: {type: int, default: 3, description: C(x) in seconds.}\n")
    monkeypatch.setattr(gen, "REPO", tmp_path)
    assert gen.main(["--check"]) == 1  # missing
    assert gen.main([]) == 0
    assert "| `demo_x` | int | `3` | `x` in seconds. |" in (role / "README.md").read_text()
    assert gen.main(["--check"]) == 0
    (role / "README.md").write_text((role / "README.md").read_text() + "hand edit\n")
    assert gen.main(["--check"]) == 1
