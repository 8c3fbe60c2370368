"""`python -m speedlimit.cli`: the same entry point as the `speedlimit` console script."""

from speedlimit.cli import main

main()
