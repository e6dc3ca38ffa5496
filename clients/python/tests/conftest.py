import sys
from pathlib import Path

# The helpers beside the tests (servers.py) import as plain modules.
sys.path.insert(0, str(Path(__file__).resolve().parent))
