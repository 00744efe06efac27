"""The real kubectl, bound to one cluster, for the end-to-end scenarios."""

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Kubectl:
    """The real kubectl, bound to one cluster."""

    binary: str
    kubeconfig: Path

    def run(self, *arguments: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, "--kubeconfig", str(self.kubeconfig), *arguments],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def ok(self, *arguments: str, stdin: str | None = None) -> str:
        """Run kubectl and return its output; fail the test with its stderr if it fails."""
        done = self.run(*arguments, stdin=stdin)
        assert done.returncode == 0, f"kubectl {' '.join(arguments)}: {done.stderr}"
        return done.stdout

    def json(self, *arguments: str) -> Any:
        return json.loads(self.ok(*arguments, "-o", "json"))


def kubectl_binary() -> str:
    found = shutil.which("kubectl") or str(REPOSITORY / ".tools" / "bin" / "kubectl")
    assert Path(found).exists(), "kubectl is missing: run scripts/install-tools"
    return found
