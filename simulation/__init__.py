"""Deterministic fault-injection simulation of sasflow (``python -m simulation``, ``make sim``)."""
