"""python -m xp.weights: the command; its code is xp/mx/weights.py (the MXNet model cache)."""
import sys

from xp.mx.weights import main

if __name__ == "__main__":
    sys.exit(main())
