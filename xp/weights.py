"""python -m xp.weights: the command; its code is xp/run/weights.py."""
import sys

from xp.run.weights import main

if __name__ == "__main__":
    sys.exit(main())
