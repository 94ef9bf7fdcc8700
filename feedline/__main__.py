"""``python -m feedline`` runs the command-line interface."""

from feedline.cli.main import _entry

if __name__ == "__main__":
    _entry()
