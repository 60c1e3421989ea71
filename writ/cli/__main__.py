"""`python -m writ.cli`: the `writ` command."""

from writ.cli import main

main()
