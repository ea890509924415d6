"""pytest setup of the exporter's tests: `pytest assets/export/tests` from the repository root (or
from anywhere) imports `unstep_export` from assets/export without PYTHONPATH."""

from __future__ import annotations

import sys
from pathlib import Path

EXPORT_DIR = Path(__file__).resolve().parents[1]  # assets/export
REPO_ROOT = EXPORT_DIR.parents[1]

if str(EXPORT_DIR) not in sys.path:
    sys.path.insert(0, str(EXPORT_DIR))
