import sys
from pathlib import Path

# Tests import their helpers (tests/serving.py) and the project packages from the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
