import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Copies of ../shared/fixtures (real OpenNebula 7.4 inputs), so a clone is self-contained.
FIXTURES = REPO / "tests" / "fixtures"
