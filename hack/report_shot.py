"""Photograph part of a fleet report (hack/screenshot_*.py): a copy of report.html with the rest hidden by one added
style rule, taken by headless chromium."""

import shutil
import subprocess
from pathlib import Path


def photograph_report(html, hide_css, out, height, workdir):
    """Write `out` (PNG, 1280 wide) of report.html `html` with `hide_css` (selectors) hidden; workdir: scratch space."""
    workdir = Path(workdir)
    shot = workdir / "shot.html"
    shot.write_text(Path(html).read_text().replace(
        "</head>", "<style>%s { display: none !important; }</style></head>" % hide_css, 1))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium not found: install it (apt-get install chromium), or open %s yourself" % html)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--user-data-dir=%s" % (workdir / "profile"), "--window-size=1280,%d" % height,
                    "--screenshot=%s" % out, shot.as_uri()], check=True, capture_output=True)
    return out
