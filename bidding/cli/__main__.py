"""``python -m bidding.cli``: the ``bidding`` command, without its console script."""

from bidding.cli import main

main()
