"""python -m xp.prepare: the command; its code is xp/data/prepare.py."""
import sys

from xp.data.prepare import main

if __name__ == "__main__":
    sys.exit(main())
