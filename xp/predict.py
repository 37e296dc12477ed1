"""python -m xp.predict: the command; its code is xp/tracking/predict.py."""
import sys

from xp.tracking.predict import main

if __name__ == "__main__":
    sys.exit(main())
