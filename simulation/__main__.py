"""Entry point: ``python -m simulation``."""

from simulation.cli import main

main()
