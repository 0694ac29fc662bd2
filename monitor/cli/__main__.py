"""`python -m monitor.cli`: the `tailwatch` command line."""

from monitor.cli import main

main()
