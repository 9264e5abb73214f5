"""``python -m sasflow_cli``: the same as the ``sasflow`` console script."""

from sasflow_cli.app import main

main()
