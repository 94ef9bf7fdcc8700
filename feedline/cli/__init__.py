"""The ``feedline`` command-line interface."""
