import sys

from xp.cli import main

sys.exit(main())
