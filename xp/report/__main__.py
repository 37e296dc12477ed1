import sys

from xp.report.build import main

sys.exit(main())
