"""`python -m fakes.host`: serve the fake host until SIGTERM or SIGINT."""

from fakes.host import main

main()
