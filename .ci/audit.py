"""CI's dependency audit: pip-audit on the installed environment (the project itself skipped). Prints every
known vulnerability and how many packages could not be looked up; exits 1 when any vulnerability is known
or pip-audit itself fails. Packages PyPI's JSON API has no data for are reported, not failed."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

PIP_AUDIT = Path(sys.executable).with_name("pip-audit")


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "audit.json"
        command = [str(PIP_AUDIT), "--skip-editable", "--progress-spinner", "off", "--format", "json"]
        result = subprocess.run([*command, "--output", str(report)], capture_output=True, text=True, check=False)
        if not report.is_file():
            print(f"pip-audit failed (exit {result.returncode}):\n{result.stderr}", file=sys.stderr)
            return 1
        dependencies = json.loads(report.read_text())["dependencies"]
    audited = [d for d in dependencies if "skip_reason" not in d]
    skipped = [d for d in dependencies if "skip_reason" in d]
    vulnerable = [d for d in audited if d.get("vulns")]
    for dependency in vulnerable:
        for vuln in dependency["vulns"]:
            fixed = ", ".join(vuln.get("fix_versions") or []) or "no fixed version"
            print(f"VULNERABLE {dependency['name']}=={dependency['version']}: {vuln['id']} (fixed in: {fixed})")
    print(
        f"pip-audit: {len(audited)} packages audited, {len(vulnerable)} with known vulnerabilities; "
        f"{len(skipped)} not looked up" + (f" (the first: {skipped[0]['skip_reason']})" if skipped else "")
    )
    if skipped and not audited:
        print("pip-audit: WARNING: nothing could be audited here; run it where PyPI's JSON API answers")
    return 1 if vulnerable else 0


if __name__ == "__main__":
    sys.exit(main())
