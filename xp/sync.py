"""python -m xp.sync: the command; its code is xp/tracking/leftovers.py."""
import sys

from xp.tracking.leftovers import main

if __name__ == "__main__":
    sys.exit(main())
