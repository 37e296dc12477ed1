"""python -m xp.sync: the command; its code is xp/tracking/sync.py."""
import sys

from xp.tracking.sync import main

if __name__ == "__main__":
    sys.exit(main())
