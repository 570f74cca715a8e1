import sys

from lintdist.runtime.watch import main

sys.exit(main())
