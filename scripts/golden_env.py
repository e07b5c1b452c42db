"""What the golden generators (scripts/hf_golden.py, scripts/tokenizer_golden.py) share: where the
goldens live in the repository, and the one error for a package the Hugging Face venv provides.
Standard library only, so that it loads before the check of those packages."""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def golden_dir(name):
    """tests/golden/NAME of this checkout."""
    return os.path.join(REPO, "tests", "golden", name)


def missing_packages(script, packages, error):
    """Exits with the fix for an ImportError of the venv's packages."""
    sys.exit(f"error: scripts/{script} needs {packages} ({error}). Fix: "
             "scripts/make-hf-venv.sh, then run it with /work/venv-hf/bin/python")
