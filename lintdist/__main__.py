"""Allow `python -m lintdist`."""

from lintdist.cli import main

main()
